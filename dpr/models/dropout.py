"""``set_attention_dropout(module, p)``: the attention-probability dropout of every attention module, set in place.

Why: BERT's attention dropout draws a Bernoulli mask the size of every attention-probability tensor
(batch x heads x length², every layer, every step): 22% of a bf16 training step on the profiled CPU
(docs/results/benchmarks.md), and any p > 0 in train mode keeps the attention off SDPA's fused kernel.
``train.attention_dropout`` sets it for training only.

Where transformers (5.x) reads it: on the attention module, at forward time. BERT's, RoBERTa's, ELECTRA's and
DistilBERT's attention pass ``dropout=self.dropout.p`` (0 in eval mode) to the attention function, eager or SDPA
alike; MPNet's applies ``self.dropout``; NomicBERT-/Llama-style modules pass a float ``self.attention_dropout``.
``config.attention_probs_dropout_prob`` is read only when the module is built, so setting the modules changes
training while the config (what ``save_pretrained`` writes to config.json) keeps the base model's value.
"""

from __future__ import annotations

import math
import numbers

from torch import nn

# The query/key/value projections that mark a self-attention module, by family: BERT/RoBERTa/ELECTRA,
# DistilBERT, MPNet, NomicBERT/Llama-style. A module without them (a feed-forward block, the embeddings) has
# a hidden-state dropout, which this lever must not touch.
_QKV_NAMES = (("query", "key", "value"), ("q_lin", "k_lin", "v_lin"), ("q", "k", "v"), ("q_proj", "k_proj", "v_proj"))


def _is_attention(module: nn.Module) -> bool:
    return any(all(isinstance(getattr(module, n, None), nn.Linear) for n in names) for names in _QKV_NAMES)


def _set(module: nn.Module, p: float) -> bool:
    """Set ``module``'s attention-probability dropout where its forward reads it; False when it has none."""
    if isinstance(getattr(module, "dropout", None), nn.Dropout):
        module.dropout.p = p
        return True
    value = getattr(module, "attention_dropout", None)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        module.attention_dropout = p
        return True
    return False


def set_attention_dropout(module: nn.Module, p: float) -> int:
    """Set the attention-probability dropout of every attention module under ``module`` to ``p`` (in [0, 1));
    returns how many modules were set. Refuses (ValueError) a model where it finds none: the caller asked for
    another dropout, and a model left unchanged would train with its own without saying so."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not math.isfinite(p) or not 0 <= p < 1:
        raise ValueError(f"train.attention_dropout must be a finite number in [0, 1) or null, got {p!r}")
    count = sum(_set(m, float(p)) for m in module.modules() if _is_attention(m))  # shared towers: once
    if count == 0:
        raise ValueError(f"train.attention_dropout: no attention module with a dropout probability found in "
                         f"{type(module).__name__} (supported: BERT-, DistilBERT-, MPNet- and Llama-style attention)")
    return count


__all__ = ["set_attention_dropout"]
