"""The Triton kernels compile for an H100 (sm_90) on any machine: Triton's own front end, optimiser and the ptxas its
wheel bundles build each kernel's cubin for the shapes the engine launches (MHA and GQA, head sizes 64/80/128, with
and without T5's bias, whole-context and split-K with its combine stage, tuned tiles and warps), so a kernel the
interpreter runs but the GPU compiler rejects fails here, without a GPU."""
import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from seq2seq_engine.kernels import triton_attention, triton_cache, triton_split
from seq2seq_engine.kernels.triton_launch import next_power_of_two

pytestmark = pytest.mark.gpu_kernel
H100 = GPUTarget("cuda", 90, 32)


def compile_for_h100(fn, pointers: dict, constants: dict, num_warps: int = 4):
    """The kernel's cubin: pointer arguments typed by ``pointers``, ``scale`` float32, every other argument int32."""
    kernel = JITFunction(fn)
    names = kernel.arg_names
    signature = {name: "constexpr" if name in constants else pointers.get(name, "fp32" if name == "scale" else "i32")
                 for name in names}
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(names.index(name),): value for name, value in constants.items()})
    return triton.compile(source, target=H100, options={"num_warps": num_warps})


@pytest.mark.parametrize("group,head_size,dtype,has_bias,index", [
    (1, 64, "bf16", True, "i32"), (1, 80, "fp16", False, "i32"), (3, 128, "fp32", False, "i32"),
    (1, 128, "bf16", True, "i64")])
def test_decode_attention_compiles_for_sm90(group, head_size, dtype, has_bias, index):
    pointers = {name: f"*{dtype}" for name in ("out_ptr", "q_ptr", "k_ptr", "v_ptr", "bias_ptr")}
    pointers.update({name: f"*{index}" for name in ("tables_ptr", "lens_ptr", "positions_ptr")})
    pointers["lut_ptr"] = "*i32"
    constants = dict(GROUP=group, GROUP_PAD=next_power_of_two(group), HEAD_SIZE=head_size,
                     HEAD_PAD=next_power_of_two(head_size), BLOCK_SIZE=16, TILE=32, HAS_BIAS=has_bias, SPLIT=False)
    for split in (False, True):  # the whole context, then one split's share writing float32 partials
        pointers["ws_ptr"] = "*fp32" if split else pointers["out_ptr"]
        constants["SPLIT"] = split
        compiled = compile_for_h100(triton_attention._paged_decode_kernel, pointers, constants)
        assert compiled.asm["cubin"] and ".target sm_90" in compiled.asm["ptx"]


@pytest.mark.parametrize("head_size,splits_pad,dtype", [(64, 16, "bf16"), (80, 4, "fp16"), (128, 2, "fp32")])
def test_split_combine_compiles_for_sm90(head_size, splits_pad, dtype):
    pointers = {"out_ptr": f"*{dtype}", "ws_ptr": "*fp32"}
    constants = dict(HEAD_SIZE=head_size, HEAD_PAD=next_power_of_two(head_size), SPLITS_PAD=splits_pad)
    compiled = compile_for_h100(triton_split._combine_kernel, pointers, constants, num_warps=2)
    assert compiled.asm["cubin"] and ".target sm_90" in compiled.asm["ptx"]


@pytest.mark.parametrize("tile,num_warps", [(16, 1), (64, 8), (128, 16)])
def test_decode_attention_compiles_with_tuning_overrides(tile, num_warps):
    pointers = {name: "*bf16" for name in ("out_ptr", "q_ptr", "k_ptr", "v_ptr", "bias_ptr")}
    pointers.update({name: "*i32" for name in ("tables_ptr", "lens_ptr", "positions_ptr", "lut_ptr")})
    pointers["ws_ptr"] = "*fp32"
    constants = dict(GROUP=1, GROUP_PAD=1, HEAD_SIZE=64, HEAD_PAD=64, BLOCK_SIZE=16, TILE=tile, HAS_BIAS=False,
                     SPLIT=True)
    compiled = compile_for_h100(triton_attention._paged_decode_kernel, pointers, constants, num_warps=num_warps)
    assert compiled.asm["cubin"]


def test_cache_kernels_compile_for_sm90():
    pointers = {name: "*bf16" for name in ("key_ptr", "value_ptr", "k_cache_ptr", "v_cache_ptr")}
    pointers["slots_ptr"] = "*i64"
    constants = dict(HEADS=12, HEADS_PAD=16, HEAD_SIZE=80, HEAD_PAD=128, BLOCK_SIZE=16)
    assert compile_for_h100(triton_cache._write_kernel, pointers, constants).asm["cubin"]
    pointers = {"src_ptr": "*bf16", "dst_ptr": "*bf16", "pairs_ptr": "*i64"}
    for gather in (True, False):
        compiled = compile_for_h100(triton_cache._copy_blocks_kernel, pointers, dict(GATHER=gather, CHUNK=1024))
        assert compiled.asm["cubin"]
