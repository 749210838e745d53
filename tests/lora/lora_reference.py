"""Random PEFT LoRA adapters (init_lora_weights=False, so B is not zero) saved as PEFT writes them, and the PEFT
model that serves each one: the reference the engine's adapters are checked against."""
import copy
from typing import Sequence, Tuple

import torch
from peft import LoraConfig, get_peft_model


def save_random_adapter(hf_model, out_dir, rank: int, target_modules, seed: int, alpha: float = None,
                        use_rslora: bool = False, b_scale: float = 1.0) -> Tuple[str, torch.nn.Module]:
    """(adapter directory, PeftModel over a copy of `hf_model`) of a random adapter of `rank` on `target_modules`
    (a list of names or a regex); `b_scale` scales B so the adapter moves the outputs of a tiny random model."""
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else 2 * rank,
                        target_modules=target_modules, init_lora_weights=False, use_rslora=use_rslora,
                        lora_dropout=0.0)
    peft_model = get_peft_model(copy.deepcopy(hf_model), config).eval()
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(b_scale)
    peft_model.save_pretrained(str(out_dir))
    return str(out_dir), peft_model


def module_names(hf_model, suffixes: Sequence[str]):
    """The names of `hf_model`'s linears ending in one of `suffixes` (PEFT's target_modules matching)."""
    return [name for name, module in hf_model.named_modules()
            if isinstance(module, torch.nn.Linear) and name.split(".")[-1] in suffixes]


def whisper_adapter(model_dir: str, out_dir) -> str:
    """A mild random adapter (rank 8 on q_proj, v_proj and fc1) of the Whisper checkpoint in `model_dir`: it moves
    the transcripts without turning them into noise."""
    import transformers
    hf_model = transformers.WhisperForConditionalGeneration.from_pretrained(model_dir).eval()
    return save_random_adapter(hf_model, out_dir, 8, ["q_proj", "v_proj", "fc1"], seed=31, b_scale=0.3)[0]
