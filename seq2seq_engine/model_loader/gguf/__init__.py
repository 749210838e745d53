"""llama.cpp GGUF checkpoints: dequantize a llama GGUF file into an HF transformers directory."""
