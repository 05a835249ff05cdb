"""The CUDA graphs' shapes: the batch sizes and the context widths the runner captures."""
from __future__ import annotations


def graph_batch_sizes(max_num_seqs: int, fine: bool = False) -> list[int]:
    """1, 2, 4, 8, 16, ... up to max_num_seqs (which is included). fine: vLLM's buckets, for one
    graph a batch size: 1, 2, 4, then every 8 to 256 and every 16 beyond, so that a batch is
    padded by at most 7 (15) rows, not up to twice its size."""
    if fine:
        steps = [1, 2, 4, *range(8, 257, 8), *range(272, max(max_num_seqs, 272) + 1, 16)]
        return [b for b in steps if b < max_num_seqs] + [max_num_seqs]
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return sizes + [max_num_seqs]


def graph_context_blocks(max_blocks: int, block_size: int, smallest_tokens: int = 64) -> list[int]:
    """Context widths (in blocks) to capture: 64, 128, 256, ... tokens, then max_blocks.

    A decode graph attends over its whole captured width (a masked dense attention), so one
    graph per width keeps the work within twice the batch's longest context instead of
    always paying for max_model_len.
    """
    widths, tokens = [], smallest_tokens
    while -(-tokens // block_size) < max_blocks:
        widths.append(-(-tokens // block_size))
        tokens *= 2
    return sorted(set(widths)) + [max_blocks]
