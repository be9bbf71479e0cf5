"""Dev metrics as objects: what a validation reports, and which way each one improves.

A :class:`DevMetric` names itself, says whether greater is better, whether it reads the corpus ranking
(and how deep) and computes one value per dev question from what the validation already holds
(:class:`DevRankings`); the validation reports the mean as ``<name>`` and its 95% interval as
``<name>_ci95``. The built-ins are DPR's average rank and MRR on the dev pool, ``top<k>`` (one per k of
``train.val_topk``) and, on qrels data, nDCG@10. :func:`register_metric` adds one: ``validate()``
reports it and ``train.best_metric=<name>`` keeps the weights by it, with no other edit.

Order is part of the output (validation.jsonl, train_summary.json): pool metrics in registration order,
then the corpus ones, ``top<k>`` first. The built-ins are registered first, so they come out as before.

No torch import here: ``dpr.training.config`` checks ``train.best_metric`` against this registry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DevRankings:
    """What one validation holds for its dev questions (row ``i`` is ``examples[i]``)."""

    examples: Sequence[dict]                     # the dev questions validated (those with a positive)
    pool_ranks: "torch.Tensor | None" = None     # float64 [n]: the best positive's rank in DPR's dev pool
                                                 # (0 = first; a tie or a non-finite score counts against it)
    corpus_ranking: list[list[str]] | None = None  # passage ids against the whole corpus, best first, to the
                                                 # deepest metric's depth; non-finite scores left out
    corpus_hits: "torch.Tensor | None" = None    # bool [n, depth]: ranked passage j of question i is a hit
                                                 # (answer-bearing on QA data, judged relevant on qrels data)
    graded: bool = False                         # qrels data (judgements, no answer strings)


@dataclass(frozen=True)
class DevMetric:
    """One dev metric. ``per_question(rankings)`` gives one number per dev question (a sequence or a 1-d
    tensor): the validation reports their mean and ``<name>_ci95``."""

    name: str
    greater_is_better: bool
    per_question: Callable[[DevRankings], Any]
    needs_corpus: bool = False   # reads corpus_ranking / corpus_hits (the passages file, train.val_corpus_topk)
    depth: int = 0               # how deep in the corpus ranking it looks (needs_corpus); the ranking is computed
                                 # to the deepest active metric, so a deep one costs every validation
    qrels_only: bool = False     # only on qrels data (graded judgements)

    def applies(self, *, corpus: bool, graded: bool) -> bool:
        """Whether a validation with (or without) the corpus, on qrels (or QA) data, reports it."""
        return (corpus or not self.needs_corpus) and (graded or not self.qrels_only)


TOPK = re.compile(r"top(\d+)")  # the val_topk family: names the registry leaves to topk_metric
_RESERVED = ("auto", "rank_pool_size", "num_questions", "epoch")  # the config's choice and the other keys
_REGISTRY: dict[str, DevMetric] = {}


def register_metric(metric: DevMetric, *, replace: bool = False) -> DevMetric:
    """Add ``metric`` to what every later validation reports (and ``train.best_metric`` accepts)."""
    name = metric.name
    if not isinstance(name, str) or not name or name in _RESERVED or name.endswith("_ci95") or TOPK.fullmatch(name):
        raise ValueError(f"dev metric name {name!r}: taken or malformed (not {', '.join(_RESERVED)}, top<k> "
                         "(from train.val_topk) or *_ci95)")
    if name in _REGISTRY and not replace:
        raise ValueError(f"dev metric {name!r} is already registered (replace=True to redefine it)")
    if metric.needs_corpus and metric.depth < 1:
        raise ValueError(f"dev metric {name!r} reads the corpus ranking: give its depth (>= 1)")
    _REGISTRY[name] = metric
    return metric


def topk_metric(k: int) -> DevMetric:
    """``top<k>``: the share of dev questions with a hit in their corpus top k."""
    return DevMetric(f"top{k}", True, lambda r: r.corpus_hits[:, :int(k)].any(dim=1).double(),
                     needs_corpus=True, depth=int(k))


def dev_metrics(val_topk: Sequence[int]) -> list[DevMetric]:
    """Every metric a validation with these k can report, in the order it reports them."""
    pool = [m for m in _REGISTRY.values() if not m.needs_corpus]
    corpus = [m for m in _REGISTRY.values() if m.needs_corpus]
    return [*pool, *(topk_metric(k) for k in val_topk), *corpus]


def metric_names(val_topk: Sequence[int]) -> list[str]:
    return [m.name for m in dev_metrics(val_topk)]


def find_metric(name: str, val_topk: Sequence[int]) -> DevMetric | None:
    return next((m for m in dev_metrics(val_topk) if m.name == name), None)


def greater_is_better(metric: str) -> bool:
    """The metric's own answer; for a name no metric registers (a loss, an old log's key) the name rule:
    ranks and losses go down as models improve, anything else up."""
    if metric in _REGISTRY:
        return _REGISTRY[metric].greater_is_better
    if TOPK.fullmatch(metric):
        return True
    return not ("rank" in metric or "loss" in metric)


def evaluate(metrics: Sequence[DevMetric], rankings: DevRankings) -> dict[str, float]:
    """``{name: mean, name_ci95: interval}`` of each metric over the dev questions, in order."""
    import torch

    out: dict[str, float] = {}
    for m in metrics:
        values = torch.as_tensor(m.per_question(rankings), dtype=torch.float64)
        if values.shape != (len(rankings.examples),):
            raise ValueError(f"dev metric {m.name!r} gave {tuple(values.shape)} values for "
                             f"{len(rankings.examples)} dev questions (one per question)")
        out[m.name] = float(values.mean())
        out[f"{m.name}_ci95"] = ci95(values)
    return out


def ci95(values: "torch.Tensor") -> float:
    """Half-width of the normal-approximation 95% interval of a mean over questions (the dev set's
    sampling error: what a difference between two runs must exceed to mean something)."""
    n = values.numel()
    return float(1.96 * values.double().std(unbiased=True) / n ** 0.5) if n > 1 else float("nan")


# ---------------------------------------------------------------------------------------------- built-ins

def _avg_rank(r: DevRankings) -> "torch.Tensor":
    return r.pool_ranks


def _mrr(r: DevRankings) -> "torch.Tensor":
    return 1.0 / (r.pool_ranks + 1)


def _ndcg10(r: DevRankings) -> list[float]:
    from dpr.eval.qrels_metrics import query_metrics

    # a dev example without qrels counts its positive_ctxs as grade 1, so the metric the trainer keeps
    # weights by on qrels data always exists; graded as trec_eval grades it
    return [query_metrics(ranked[:10], ex.get("qrels") or {c["passage_id"]: 1 for c in ex["positive_ctxs"]},
                          ["ndcg@10"])["ndcg@10"]
            for ranked, ex in zip(r.corpus_ranking, r.examples)]


AVG_RANK = register_metric(DevMetric("avg_rank", False, _avg_rank))
MRR = register_metric(DevMetric("mrr", True, _mrr))
NDCG10 = register_metric(DevMetric("ndcg@10", True, _ndcg10, needs_corpus=True, depth=10, qrels_only=True))
