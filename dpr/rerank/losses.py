"""Cross-encoder losses over groups: each row is one question's candidates (its positive and N negatives).

Both take ``scores [B, G]`` (logits), ``positive [B, G]`` and ``ignore [B, G]`` booleans (the masks of
`dpr.training.masks.pair_masks`: an ignored pair -- an answer-bearing or judged passage that slipped into
a question's negatives -- is neither pushed down nor pulled up) and return a scalar.

- ``listwise`` (the default; Tevatron's reranker, sentence-transformers' ``CrossEntropyLoss`` for
  rerankers): softmax cross-entropy of the positive(s) against the group, ``-log(sum_pos e^s / sum e^s)``
  over the non-ignored candidates. Needs the scores of a group to be comparable with each other only.
- ``bce``: pointwise binary cross-entropy of each non-ignored pair's logit against its label (the
  classic MS MARCO cross-encoder), averaged over those pairs.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


def listwise_loss(scores: torch.Tensor, positive: torch.Tensor, ignore: torch.Tensor) -> torch.Tensor:
    """Mean over questions of ``-log softmax`` mass on the positives (multi-positive: logsumexp over them)."""
    scores = scores.float()
    keep = ~ignore
    if not bool((positive & keep).any(dim=1).all()):
        raise ValueError("every group needs a positive that is not ignored")
    logits = scores.masked_fill(~keep, NEG_INF)
    pos = logits.masked_fill(~positive, NEG_INF)
    return (torch.logsumexp(logits, dim=1) - torch.logsumexp(pos, dim=1)).mean()


def bce_loss(scores: torch.Tensor, positive: torch.Tensor, ignore: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy with logits over the non-ignored pairs (label 1 for positives, 0 otherwise)."""
    keep = ~ignore
    if not bool(keep.any()):
        raise ValueError("no pair left to score: every candidate is ignored")
    per_pair = F.binary_cross_entropy_with_logits(scores.float(), positive.float(), reduction="none")
    return per_pair[keep].mean()


LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "listwise": listwise_loss, "bce": bce_loss,
}


def group_accuracy(scores: torch.Tensor, positive: torch.Tensor, ignore: torch.Tensor) -> float:
    """Share of groups whose best non-ignored candidate is a positive."""
    best = scores.float().masked_fill(ignore, NEG_INF).argmax(dim=1)
    return float(positive.gather(1, best[:, None]).float().mean())
