"""Encode a padded batch in length-sorted buckets: the same vectors for far fewer padded tokens.

A training batch is padded to its longest text. On squad1_open a two-tower step's 64 passages
average ~99 tokens but pad to ~175 (most batches hold one passage near the 192-token cut), so ~43%
of the passage tower's forward and backward work is padding. Sorting the rows by length and running
the encoder on buckets of ``bucket_size`` rows, each cut to its own longest row, removes most of it
(buckets of 8: ~0.63x the tokens of one padded forward, buckets of 16: ~0.69x, simulated on that
corpus). Padding is masked out of attention and pooling, so every row's vector is the one the
single padded forward computes, up to floating-point rounding (other matrix shapes); dropout masks
are drawn per bucket, so a training run with dropout follows another (equally likely) random path.

It all happens inside one ``forward`` of the model, so DistributedDataParallel still sees one
forward and one backward per step; the result is put back in input order with a differentiable
index, so gradients reach every row's bucket.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch


def trim_padding(inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The rows' tensors without the columns where every row is padding (left or right padding alike).

    Only on the CPU: finding the columns reads the mask, which on a GPU would make the host wait for the device
    inside the step; there the padded columns stay (masked, so the same vectors up to rounding)."""
    chunk = dict(inputs)
    mask = chunk.get("attention_mask")
    if mask is None or mask.dim() != 2 or mask.device.type != "cpu":
        return chunk
    used = mask.bool().any(dim=0).nonzero()
    if not used.numel():
        return chunk
    lo, hi = int(used[0]), int(used[-1]) + 1
    width = mask.shape[1]
    if (lo, hi) == (0, width):
        return chunk
    return {k: v[:, lo:hi] if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[1] == width else v
            for k, v in chunk.items()}


def length_order(attention_mask: torch.Tensor) -> torch.Tensor:
    """Row indices, longest first (ties in input order, so the buckets are deterministic)."""
    lengths = attention_mask.long().sum(dim=1)
    return torch.sort(lengths, descending=True, stable=True).indices


def encode_bucketed(encode: Callable[..., torch.Tensor], inputs: Mapping[str, torch.Tensor],
                    bucket_size: int) -> torch.Tensor:
    """``encode(**inputs)`` computed bucket by bucket (see module docstring), rows in input order.

    ``bucket_size <= 0``, a batch that fits one bucket, or inputs without an ``attention_mask`` take
    the single padded forward.
    """
    mask = inputs.get("attention_mask")
    n = int(inputs["input_ids"].shape[0])
    if bucket_size <= 0 or n <= bucket_size or mask is None:
        return encode(**inputs)
    order = length_order(mask).to(inputs["input_ids"].device)
    outs = [encode(**trim_padding({k: v[rows] for k, v in inputs.items()})) for rows in order.split(bucket_size)]
    return restore_order(torch.cat(outs), order)


def restore_order(rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``rows[k]`` computed for input row ``order[k]`` -> rows in input order (a differentiable gather)."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return rows.index_select(0, inverse)
