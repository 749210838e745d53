"""Helpers of the GGUF llama tests: transformers' own GGUF loader as the reference, and a test-side GGUF writer
(llama.cpp's tensor names and Q/K permutation) for random tiny HF Llamas."""
import gguf
import numpy as np
import pytest
import transformers

QTYPE = gguf.GGMLQuantizationType


def hf_from_gguf(directory, file_name):
    """transformers' model loaded from the GGUF file, dequantized to float32.

    transformers refuses gguf_file= unless accelerate is importable, although its CPU float32 path never uses it;
    accelerate is no dependency of this project, so the check is bypassed for this call only (raising=True: a
    transformers without that check fails here loudly)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformers.modeling_utils, "is_accelerate_available", lambda: True)
        return transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=file_name).eval()


# --------------------------------------------------------------------------- test-side GGUF writer
_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}


def llama_cpp_permute(weight, n_head):
    """llama.cpp convert_hf_to_gguf's Q/K row order: each head's halves interleaved pairwise."""
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:]).swapaxes(1, 2) \
        .reshape(weight.shape)


def _gguf_name(hf_name):
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    _, _, index, *rest = hf_name.split(".")
    return f"blk.{index}.{_LAYER['.'.join(rest[:-1])]}.weight"


def write_llama_gguf(path, config, tensors, architecture="llama", drop_metadata=()):
    """tensors: {gguf name: (float32 array in HF layout, GGML type)} written as `path`."""
    writer = gguf.GGUFWriter(str(path), architecture)
    metadata = {"block_count": config.num_hidden_layers, "context_length": config.max_position_embeddings,
                "embedding_length": config.hidden_size, "feed_forward_length": config.intermediate_size,
                "head_count": config.num_attention_heads, "head_count_kv": config.num_key_value_heads,
                "layer_norm_rms_eps": config.rms_norm_eps, "rope_freq_base": 10000.0, "vocab_size": config.vocab_size,
                "rope_dimension_count": config.hidden_size // config.num_attention_heads,
                "bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
                "pad_token_id": config.pad_token_id}
    for key, value in metadata.items():
        if key not in drop_metadata:
            getattr(writer, f"add_{key}")(value)
    plain = {QTYPE.F32: np.float32, QTYPE.F16: np.float16, QTYPE.F64: np.float64, QTYPE.I32: np.int32}
    for name, (array, qtype) in tensors.items():
        if qtype in plain:
            writer.add_tensor(name, np.ascontiguousarray(array.astype(plain[qtype])))
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def gguf_tensors_of(model):
    """The HF model's weights as llama.cpp stores them: renamed, Q/K permuted; MLP Q8_0, V F16, the rest F32."""
    config, tensors = model.config, {}
    for name, tensor in model.state_dict().items():
        gguf_name, array = _gguf_name(name), tensor.numpy()
        if ".attn_q." in gguf_name:
            array = llama_cpp_permute(array, config.num_attention_heads)
        elif ".attn_k." in gguf_name:
            array = llama_cpp_permute(array, config.num_key_value_heads)
        qtype = QTYPE.Q8_0 if ".ffn_" in gguf_name and array.ndim == 2 else \
            QTYPE.F16 if ".attn_v." in gguf_name else QTYPE.F32
        tensors[gguf_name] = (array, qtype)
    return tensors
