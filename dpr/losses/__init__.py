"""Training losses: one module per loss, one interface (see :mod:`dpr.losses.base`).

Chosen with the ``loss`` config group (``conf/loss/<name>.yaml`` holds ``_target_`` and the loss's own
keys); :func:`build_loss` instantiates it. A new loss is one module here and one YAML file.
"""

from __future__ import annotations

from typing import Any, Mapping

from dpr.losses.base import (LossOutput, PairMasks, gather_passages, loss_output, rank_stats, score_pool,
                             teacher_scored)
from dpr.losses.hinge import HingeLoss
from dpr.losses.kl_distill import KLDistillLoss
from dpr.losses.lexical_distill import LexicalDistillLoss
from dpr.losses.margin_mse import MarginMSELoss
from dpr.losses.softmax_nll import SoftmaxNLLLoss, masked_softmax_nll
from dpr.losses.symmetric_nll import SymmetricSoftmaxNLLLoss

__all__ = ["LossOutput", "PairMasks", "SoftmaxNLLLoss", "SymmetricSoftmaxNLLLoss", "HingeLoss", "LexicalDistillLoss",
           "KLDistillLoss", "MarginMSELoss", "build_loss", "gather_passages", "masked_softmax_nll", "rank_stats",
           "score_pool", "loss_output", "teacher_scored"]


def build_loss(cfg: Mapping[str, Any] | None):
    """The loss named by ``cfg['_target_']`` with the other keys as arguments (default: softmax NLL)."""
    if not cfg:
        return SoftmaxNLLLoss()
    from hydra.utils import get_class

    cfg = dict(cfg)
    target = cfg.pop("_target_", None)
    if not target:
        raise ValueError("loss config needs a _target_ (e.g. dpr.losses.SoftmaxNLLLoss)")
    cls = get_class(target)
    try:
        return cls(**cfg)
    except TypeError as err:
        raise ValueError(f"loss {target}: {err}") from None
