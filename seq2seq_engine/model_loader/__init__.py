"""Model sources: resolve a model name or path, convert CTranslate2/GGUF checkpoints once, and load the weights.

`resolver.resolve_model_path` turns a short name, HF directory, CTranslate2 directory or GGUF file into an HF
directory (`conversion_cache` keeps converted copies); `loader.load_model` builds the model and loads its weights.
"""
