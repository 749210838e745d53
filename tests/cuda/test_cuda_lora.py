"""LoRA adapters on CUDA: a batch mixing two adapters and the base model gives the tokens the CPU engine gives (which
equal HF PEFT's, tests/lora/), float32 with TF32 off; the slots and the Triton shrink/expand kernels on the device."""
import gc
import json
import os

import pytest
import torch
from cuda_models import NUM_TOKENS, build_case, strict_float32
from safetensors.torch import save_file

from seq2seq_engine import LLM, LoRARequest, SamplingParams

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TARGETS = {"bart": ("self_attn.q_proj", "self_attn.v_proj", "encoder_attn.k_proj", "fc1"),
           "llama": ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")}
DEVICES = ("cuda", "cpu")


def write_adapter(folder, model, suffixes, rank, seed):
    """A PEFT-format adapter of random A and B (no peft import: the GPU image has none) on the named linears."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.endswith(suffixes):
            a = torch.randn(rank, module.in_features, generator=generator) / module.in_features ** 0.5
            b = torch.randn(module.out_features, rank, generator=generator) * 0.5
            tensors[f"base_model.model.{name}.lora_A.weight"] = a
            tensors[f"base_model.model.{name}.lora_B.weight"] = b
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as handle:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank}, handle)
    return str(folder)


def run(case, device, adapters):
    llm = LLM(case.model_dir, skip_tokenizer_init=True, dtype="float32", device=device, num_gpu_blocks_override=512,
              swap_space_gb=0.05, max_num_seqs=16, enable_lora=True, max_loras=2)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=0)
    outputs = llm.generate(case.prompts, params, use_tqdm=False, lora_request=adapters)
    del llm
    gc.collect()
    return [(o.outputs[0].token_ids, [lp[t] for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
            for o in outputs]


@pytest.mark.parametrize("arch", sorted(TARGETS))
def test_mixed_adapters_on_cuda_match_the_cpu_engine(arch, tmp_path):
    import transformers
    case = build_case(arch, tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(case.model_dir) if arch == "llama" else \
        transformers.AutoModelForSeq2SeqLM.from_pretrained(case.model_dir)
    requests = [LoRARequest(f"a{i}", i + 1, write_adapter(tmp_path / f"a{i}", model, TARGETS[arch], 8, i))
                for i in range(2)]
    adapters = [requests[0], requests[1], None] * (len(case.prompts) // 3 + 1)
    with strict_float32():
        results = {device: run(case, device, adapters[:len(case.prompts)]) for device in DEVICES}
    for (gpu_tokens, gpu_logprobs), (cpu_tokens, cpu_logprobs) in zip(results["cuda"], results["cpu"]):
        assert gpu_tokens == cpu_tokens
        assert max(abs(g - c) for g, c in zip(gpu_logprobs, cpu_logprobs)) < 1e-3
    torch.cuda.empty_cache()
