"""What every loss takes and returns, and the one gradient-correct gather they share.

A loss is called as ``loss(q, p, masks, similarity, gather=True) -> LossOutput``:

- ``q`` ``[B, D]``: this rank's question vectors (with gradients).
- ``p`` ``[N, D]``: this rank's candidate passages. With ``gather=True`` under DDP they are
  all-gathered (:func:`gather_passages`), so the candidate pool has ``N_global`` rows, rank 0's first.
- ``masks``: :class:`PairMasks` over ``[B, N_global]`` -- which candidates are positives of each
  question and which are ignored (neither positive nor negative: false negatives such as another
  positive of a multi-positive query or a passage that contains the question's answer). The number
  of candidates per question follows from the shapes and the masks; there is no second channel.
- ``similarity(q, p) -> [B, N]`` scores (``BiEncoder.similarity``: dot or cosine / temperature).

Loss scaling under DDP (W ranks): each rank's loss is the mean over its *local* questions against the
*global* pool; :func:`dpr.distributed.all_gather_with_grad`'s backward sums each slice's gradient over
ranks, and DDP averages parameter gradients, so the objective equals one process holding the global
batch (tests/system/test_distributed.py checks it). Questions need no gather: no rank scores another's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from dpr import distributed

Similarity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class LossOutput:
    """``loss``: the tensor to backpropagate (detached after a step). ``accuracy``: share of this rank's
    questions whose best-scoring non-ignored candidate is a positive; ``avg_rank``: mean number of
    negatives scoring above the question's best positive (0 = top); ``num_candidates``: pool size;
    ``masked``: (question, candidate) pairs removed from the negatives by the ignore mask.

    ``accuracy``, ``avg_rank`` and ``masked`` are 0-dim tensors on the scores' device: reading one as a number
    waits for the device, which the trainer does only at its logging intervals (no host
    synchronisation inside a step); ``float(out.accuracy)`` where a number is needed."""

    loss: torch.Tensor
    accuracy: float | torch.Tensor
    avg_rank: float | torch.Tensor
    num_candidates: int
    masked: int | torch.Tensor = 0


@dataclass
class PairMasks:
    """Boolean ``[B, N]`` masks over (question, candidate) pairs (a pair may not be both positive and
    ignored: :meth:`validate`), and optionally a teacher's ``[B, N]`` scores of the same pairs (for
    distillation losses, e.g. BM25's as a lexical teacher, or a cross-encoder's from a scores file);
    NaN marks a pair the teacher did not score (:func:`teacher_scored`)."""

    positive: torch.Tensor
    ignore: torch.Tensor
    teacher: torch.Tensor | None = None

    @classmethod
    def dpr_layout(cls, num_questions: int, passages_per_question: int, offset: int = 0,
                   num_candidates: int | None = None, device: torch.device | str | None = None) -> "PairMasks":
        """DPR's layout: question ``i``'s positive is candidate ``offset + i * per_q``; nothing ignored."""
        n = num_candidates if num_candidates is not None else offset + num_questions * passages_per_question
        pos = torch.zeros(num_questions, n, dtype=torch.bool, device=device)
        rows = torch.arange(num_questions, device=device)
        pos[rows, offset + rows * passages_per_question] = True
        return cls(pos, torch.zeros_like(pos))

    def to(self, device: torch.device | str) -> "PairMasks":
        teacher = self.teacher.to(device) if self.teacher is not None else None
        return PairMasks(self.positive.to(device), self.ignore.to(device), teacher)

    def validate(self, num_questions: int, num_candidates: int) -> None:
        shape = (num_questions, num_candidates)
        if tuple(self.positive.shape) != shape or tuple(self.ignore.shape) != shape:
            raise ValueError(f"masks must be {shape} (questions x candidates), got positive "
                             f"{tuple(self.positive.shape)} and ignore {tuple(self.ignore.shape)}")
        if bool((self.positive & self.ignore).any()):
            raise ValueError("a (question, candidate) pair is marked both positive and ignored")
        if not bool(self.positive.any(dim=1).all()):
            raise ValueError("every question needs at least one positive candidate")

    def cat(self, other: "PairMasks") -> "PairMasks":
        """Candidates of ``other`` appended after this pool's (columns)."""
        teacher = None
        if self.teacher is not None and other.teacher is not None:
            teacher = torch.cat([self.teacher, other.teacher], 1)
        return PairMasks(torch.cat([self.positive, other.positive], 1), torch.cat([self.ignore, other.ignore], 1),
                         teacher)


def teacher_scored(masks: PairMasks, name: str) -> torch.Tensor:
    """``[B, N]`` booleans: pairs with a teacher score (not NaN) that are not ignored -- the pairs a
    distillation term may use. ``name`` (the loss) goes into the error when the scores are missing."""
    if masks.teacher is None or tuple(masks.teacher.shape) != tuple(masks.positive.shape):
        got = None if masks.teacher is None else tuple(masks.teacher.shape)
        raise ValueError(f"loss {name} needs the teacher's scores of the (question, candidate) pairs "
                         f"({tuple(masks.positive.shape)}), got {got}: set train.teacher_scores")
    return ~torch.isnan(masks.teacher) & ~masks.ignore


def gather_passages(p: torch.Tensor, gather: bool = True) -> torch.Tensor:
    """The global candidate pool: every rank's ``p`` in rank order (gradients flow back to each slice)."""
    if gather and distributed.is_distributed():
        sizes = distributed.all_gather_sizes(p.shape[0], p)
        return distributed.all_gather_with_grad(p, sizes)
    return p


@torch.no_grad()
def rank_stats(scores: torch.Tensor, masks: PairMasks) -> tuple[torch.Tensor, torch.Tensor]:
    """``(accuracy, avg_rank)`` as 0-dim tensors (no host sync): negatives (not positive, not ignored) above
    each question's best positive."""
    if scores.shape[0] == 0:
        return scores.new_zeros((), dtype=torch.float32), scores.new_zeros((), dtype=torch.float32)
    neg_inf = torch.finfo(scores.dtype).min
    best_pos = scores.masked_fill(~masks.positive, neg_inf).max(dim=1, keepdim=True).values
    negatives = ~(masks.positive | masks.ignore)
    ranks = ((scores > best_pos) & negatives).sum(dim=1).float()
    return (ranks == 0).float().mean(), ranks.mean()


def score_pool(q: torch.Tensor, p: torch.Tensor, masks: PairMasks, similarity: Similarity,
               gather: bool = True) -> tuple[torch.Tensor, PairMasks]:
    """What every loss does first: check shapes, gather the pool, check the masks against it, and score
    every (question, candidate) pair in fp32 (even under autocast). Returns ``(scores [B, N], masks)``."""
    if q.dim() != 2 or p.dim() != 2 or q.shape[1] != p.shape[1]:
        raise ValueError(f"expected q [B, D] and p [N, D] with the same D, got {tuple(q.shape)} and {tuple(p.shape)}")
    pool = gather_passages(p, gather)
    masks = masks.to(q.device)
    masks.validate(q.shape[0], pool.shape[0])
    return similarity(q, pool).float(), masks


def loss_output(loss: torch.Tensor, scores: torch.Tensor, masks: PairMasks) -> LossOutput:
    """A loss's output with the shared figures (in-batch accuracy and rank, pool size, masked pairs)."""
    accuracy, avg_rank = rank_stats(scores, masks)
    return LossOutput(loss=loss, accuracy=accuracy, avg_rank=avg_rank, num_candidates=int(scores.shape[1]),
                      masked=masks.ignore.sum())
