"""LoRA adapters served beside one base model: PEFT adapters read and mapped onto the model's linears, device slots
and a host LRU of loaded adapters, and the linear wrapper that adds each row's adapter in mixed batches."""
