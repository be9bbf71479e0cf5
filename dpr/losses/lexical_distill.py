"""The softmax NLL plus distillation from a lexical teacher (BM25), after LED (Zhang et al., 2022).

    loss_i = NLL_i + alpha * KL( softmax(t_i / tau) || softmax(s_i) )     over the non-ignored candidates

``t`` are the teacher's scores of the same (question, candidate) pairs (``masks.teacher``, filled by the
trainer from the dataset's BM25 index when the loss declares ``teacher = "bm25"``), ``s`` the model's
(temperature-scaled) scores. The NLL keeps the labels in charge; the KL term teaches the dense model
BM25's ranking of the rest of the pool -- which passages share the question's rare words -- the
knowledge a dense model lacks on benchmarks whose questions were written looking at the passage.
"""

from __future__ import annotations

import torch

from dpr.losses.base import LossOutput, PairMasks, Similarity, loss_output, score_pool
from dpr.losses.softmax_nll import masked_softmax_nll


class LexicalDistillLoss:
    name = "lexical_distill"
    teacher = "bm25"  # what the trainer must put in masks.teacher

    def __init__(self, alpha: float = 1.0, teacher_temperature: float = 1.0) -> None:
        if alpha < 0 or teacher_temperature <= 0:
            raise ValueError(f"need alpha >= 0 and teacher_temperature > 0, got {alpha}, {teacher_temperature}")
        self.alpha, self.tau = float(alpha), float(teacher_temperature)

    def __call__(self, q: torch.Tensor, p: torch.Tensor, masks: PairMasks, similarity: Similarity,
                 gather: bool = True) -> LossOutput:
        scores, masks = score_pool(q, p, masks, similarity, gather)
        if masks.teacher is None or tuple(masks.teacher.shape) != tuple(masks.positive.shape):
            raise ValueError("lexical_distill needs the teacher's scores of every (question, candidate) pair")
        nll = masked_softmax_nll(scores, masks)
        neg_inf = torch.finfo(scores.dtype).min
        log_student = torch.log_softmax(scores.masked_fill(masks.ignore, neg_inf), dim=1)
        teacher = torch.softmax((masks.teacher.float() / self.tau).masked_fill(masks.ignore, neg_inf), dim=1)
        # KL(teacher || student), ignored pairs have zero teacher mass and drop out
        kl = (teacher * (torch.log(teacher.clamp(min=1e-12)) - log_student)).masked_fill(masks.ignore, 0.0).sum(dim=1)
        return loss_output((nll + self.alpha * kl).mean(), scores, masks)
