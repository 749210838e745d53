"""xformers attention-bias classes, imported quietly: they describe prefill masks on every device."""
import logging


def _import_attn_bias():
    # On CPU-only torch, importing xformers logs a long warning about missing CUDA kernels; it is harmless here.
    logger = logging.getLogger("xformers")
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from xformers.ops.fmha import attn_bias
    finally:
        logger.setLevel(previous)
    return attn_bias


_attn_bias = _import_attn_bias()
AttentionBias = _attn_bias.AttentionBias
BlockDiagonalMask = _attn_bias.BlockDiagonalMask
BlockDiagonalCausalMask = _attn_bias.BlockDiagonalCausalMask
BlockDiagonalCausalFromBottomRightMask = _attn_bias.BlockDiagonalCausalFromBottomRightMask


def is_causal(bias: AttentionBias) -> bool:
    """Whether the bias masks future keys (top-left or bottom-right aligned)."""
    return isinstance(bias, (BlockDiagonalCausalMask, BlockDiagonalCausalFromBottomRightMask))


def segment_bounds(bias: AttentionBias):
    """(q_start, q_end, k_start, k_end) for each block of a block-diagonal bias."""
    q_starts, k_starts = bias.q_seqinfo.seqstart_py, bias.k_seqinfo.seqstart_py
    return [(q_starts[i], q_starts[i + 1], k_starts[i], k_starts[i + 1]) for i in range(len(q_starts) - 1)]
