"""CTranslate2 model directories: the model.bin reader and the Whisper and text-model → HF transformers conversions.

The public entry points live in `seq2seq_engine.model_loader.ct2.whisper` (read_ct2_model, ct2_whisper_to_hf,
load_ct2_whisper, `python -m seq2seq_engine.model_loader.ct2.whisper CT2_DIR OUT_DIR`) and
`seq2seq_engine.model_loader.ct2.text` (ct2_text_to_hf, load_ct2_text, `python -m seq2seq_engine.model_loader.ct2.text
CT2_DIR OUT_DIR`).
"""
from seq2seq_engine.model_loader.ct2.model_bin import model_bin_files, read_ct2_model

__all__ = ["model_bin_files", "read_ct2_model"]
