"""Validation during training: DPR's average rank on the dev pool, and top-k accuracy over the corpus.

- **Average rank** (DPR's ``validate_average_rank``): every dev question is scored against one pool
  made of all dev questions' positives and up to ``hard_negatives`` of their negatives (duplicates
  removed). A question's rank is the number of pool passages that are not its positives and score
  at least as high as its best positive (0 = ranked first; a tie counts against the positive). Lower is better; cheap, so it runs every validation.
- **Corpus top-k** (k = 1, 5, 20): dev questions against the whole passage corpus (encoded with the
  current weights). A hit is a passage that contains an answer string (``has_answer``), or, for data
  without answers (qrels), one of the question's positive passages.

This module computes the rankings; the metrics read from them are objects in
:mod:`dpr.training.dev_metrics` (avg_rank, mrr, top<k>, ndcg@10 and any registered there), which also say
whether greater is better.

A non-finite score (NaN or an infinity: diverged weights) ranks *last*, never first: a positive scored
NaN gets the worst rank of its pool and misses every top-k, a negative scored NaN beats nobody (plain
comparisons would do the opposite: ``NaN > best`` is false, so NaN everywhere would read as rank 0 and a
perfect MRR; ``topk`` puts NaN first). A non-finite metric is never the best so far.

Every rank computes the same numbers (so they agree on the best checkpoint without a broadcast, and
no rank idles at a barrier long enough to time out).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

# greater_is_better: also what dpr.training.trainer imports from here
from dpr.training.dev_metrics import DevMetric, DevRankings, dev_metrics, evaluate, greater_is_better

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DevEncoding:
    """How validation encodes the dev questions and passages: truncation lengths per tower, the autocast
    precision ("off", "bf16", "fp16") and the texts per forward."""

    question_max_length: int = 64
    passage_max_length: int = 256
    autocast: str = "off"
    batch_size: int = 64

    def encode(self, model, tokenizer, texts, tower: str, *, titles=None, tokens=None) -> torch.Tensor:
        """``texts`` encoded by ``tower`` ("question" or "passage") of ``model``."""
        from dpr.models.encode_options import EncodeOptions
        from dpr.models.inference import encode_texts

        max_length = self.question_max_length if tower == "question" else self.passage_max_length
        options = EncodeOptions(batch_size=self.batch_size, max_length=max_length, autocast=self.autocast,
                                tokens=tokens)
        return encode_texts(model, tokenizer, texts, tower, options, titles=titles)


def _select(examples: Sequence[dict], max_questions: int) -> list[dict]:
    examples = [ex for ex in examples if ex["positive_ctxs"]]
    # the first N (the dev file's order) keeps the validation set fixed across runs and steps
    return list(examples[:max_questions]) if max_questions and max_questions > 0 else list(examples)


def _rank_pool(examples: Sequence[dict], hard_negatives: int) -> dict[str, dict]:
    pool: dict[str, dict] = {}
    for ex in examples:
        pool.setdefault(ex["positive_ctxs"][0]["passage_id"], ex["positive_ctxs"][0])
        for ctx in (ex["hard_negative_ctxs"] + ex["negative_ctxs"])[:hard_negatives]:
            pool.setdefault(ctx["passage_id"], ctx)
    return pool


@torch.no_grad()
def average_rank(
    model,
    tokenizer,
    examples: Sequence[dict],
    *,
    hard_negatives: int = 30,
    max_questions: int = 0,
    encoding: DevEncoding = DevEncoding(),
    question_vectors: torch.Tensor | None = None,
    known_passages: tuple[list[str], torch.Tensor] | None = None,
) -> dict:
    """DPR's average rank of each dev question's positive within the pooled dev passages, and every other
    registered pool metric (MRR, ...), with the pool's size and the number of questions; ``encoding``: how what
    is not given is encoded.

    ``question_vectors`` (rows of the selected examples) and ``known_passages`` (ids, vectors — the
    encoded corpus) skip re-encoding what the caller already has; only missing pool passages are encoded.
    """
    examples = _select(examples, max_questions)
    if not examples:
        return {}
    q = question_vectors
    if q is None:
        q = encoding.encode(model, tokenizer, [ex["question"] for ex in examples], "question")
    ranks, pool_size = _pool_ranks(model, tokenizer, examples, q, known_passages, hard_negatives=hard_negatives,
                                   encoding=encoding)
    pool_metrics = [m for m in dev_metrics(()) if not m.needs_corpus]
    return {**evaluate(pool_metrics, DevRankings(examples, pool_ranks=ranks)),
            "rank_pool_size": pool_size, "num_questions": len(examples)}


def _pool_ranks(model, tokenizer, examples: Sequence[dict], q: torch.Tensor,
                known_passages: tuple[list[str], torch.Tensor] | None, *, hard_negatives: int,
                encoding: DevEncoding) -> tuple[torch.Tensor, int]:
    """Each question's rank in the dev pool (float64) and the pool's size."""
    pool = _rank_pool(examples, hard_negatives)
    ids = list(pool)
    col = {pid: j for j, pid in enumerate(ids)}
    known_row = {pid: j for j, pid in enumerate(known_passages[0])} if known_passages is not None else {}
    missing = [pid for pid in ids if pid not in known_row]
    p = torch.empty(len(ids), q.shape[1])
    if known_row:
        have = [j for j, pid in enumerate(ids) if pid in known_row]
        p[have] = known_passages[1][[known_row[ids[j]] for j in have]]
    if missing:
        p[[col[pid] for pid in missing]] = encoding.encode(
            model, tokenizer, [pool[i]["text"] for i in missing], "passage",
            titles=[pool[i].get("title") or "" for i in missing])
    ranks = []
    for start in range(0, len(examples), 256):
        scores = _similarity(model, q[start:start + 256], p)
        for row, ex in zip(scores, examples[start:start + 256]):
            gold = torch.zeros(len(ids), dtype=torch.bool)
            for c in ex["positive_ctxs"]:
                if c["passage_id"] in col:
                    gold[col[c["passage_id"]]] = True
            best = row[gold].max()
            # a positive scored NaN/inf (now -inf) ranks below every other passage; a tie counts against it
            # (a collapsed model that scores every passage alike must not look perfect)
            ranks.append(int((row[~gold] >= best).sum()) if torch.isfinite(best) else int((~gold).sum()))
    return torch.tensor(ranks, dtype=torch.float64), len(ids)


def _similarity(model, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    # The model's own similarity (dot or cosine / temperature): the same ordering the loss trains.
    # Non-finite scores become -inf: last in every ranking (see the module docstring).
    scores = model.similarity(q, p).float().cpu()
    return torch.where(torch.isfinite(scores), scores, torch.tensor(float("-inf")))


def load_corpus(passages_path: str | Path, max_passages: int = 0) -> tuple[list[str], list[str], list[str]] | None:
    """``(ids, texts, titles)`` of the corpus, or None when it has more than ``max_passages`` (> 0)."""
    from dpr.data.passages import count_passages, iter_passages

    if max_passages and max_passages > 0:
        n = count_passages(passages_path)
        if n > max_passages:
            log.warning("corpus %s has %d passages > val_corpus_max_passages=%d: skipping corpus top-k",
                        passages_path, n, max_passages)
            return None
    ids, texts, titles = [], [], []
    for row in iter_passages(passages_path):
        ids.append(row["id"])
        texts.append(row["text"])
        titles.append(row.get("title") or "")
    return ids, texts, titles


@torch.no_grad()
def corpus_topk_accuracy(
    model,
    tokenizer,
    examples: Sequence[dict],
    corpus: tuple[list[str], list[str], list[str]],
    *,
    ks: Sequence[int] = (1, 5, 20),
    use_answers: bool = True,
    max_questions: int = 0,
    encoding: DevEncoding = DevEncoding(),
    question_vectors: torch.Tensor | None = None,
    passage_vectors: torch.Tensor | None = None,
) -> dict:
    """Top-k accuracy of dev questions against the whole corpus: ``{"top1": .., "top5": .., "top20": ..}``;
    for qrels data (examples carrying ``qrels``) also ``ndcg@10``, graded as trec_eval grades it; and every
    other registered corpus metric that applies. ``encoding``: how the vectors not given are encoded."""
    examples = _select(examples, max_questions)
    metrics = _corpus_metrics(ks, use_answers)
    if not examples or not corpus[0] or not metrics:
        return {}
    p = passage_vectors
    if p is None:
        p = encoding.encode(model, tokenizer, corpus[1], "passage", titles=corpus[2])
    q = question_vectors
    if q is None:
        q = encoding.encode(model, tokenizer, [ex["question"] for ex in examples], "question")
    ranking, hits = _corpus_ranking(model, examples, corpus, q, p, metrics, use_answers)
    return evaluate(metrics, DevRankings(examples, corpus_ranking=ranking, corpus_hits=hits, graded=not use_answers))


def _corpus_metrics(ks: Sequence[int], use_answers: bool) -> list[DevMetric]:
    return [m for m in dev_metrics(ks) if m.needs_corpus and m.applies(corpus=True, graded=not use_answers)]


def _corpus_ranking(model, examples: Sequence[dict], corpus: tuple[list[str], list[str], list[str]],
                    q: torch.Tensor, p: torch.Tensor, metrics: Sequence[DevMetric],
                    use_answers: bool) -> tuple[list[list[str]], torch.Tensor]:
    """Each question's corpus ranking (ids, best first) to the deepest metric's depth, and its hits."""
    from dpr.data.retriever_json import relevant_ids
    from dpr.eval.has_answer import has_answer

    ids, texts, _ = corpus
    # one ranking serves every metric (top-k and nDCG@10: max(k, 10) on qrels data, max(k) on QA data)
    depth = min(max(m.depth for m in metrics), len(ids))
    ranking: list[list[str]] = []
    hits = torch.zeros(len(examples), depth, dtype=torch.bool)
    for start in range(0, len(examples), 256):
        top = _similarity(model, q[start:start + 256], p).topk(depth, dim=1)
        # a -inf (non-finite) score is no result at all: ties among them must not count as hits
        ranked_rows = [[j for j, v in zip(row, vals) if v != float("-inf")]
                       for row, vals in zip(top.indices.tolist(), top.values.tolist())]
        for i, (ranked, ex) in enumerate(zip(ranked_rows, examples[start:start + 256])):
            ranking.append([ids[j] for j in ranked])
            answers = ex.get("answers") or []
            if use_answers and answers:
                found = [has_answer(answers, texts[j]) for j in ranked]
            else:  # qrels data, or a QA example without answers: its judged-relevant passages
                gold = relevant_ids(ex)
                found = [ids[j] in gold for j in ranked]
            hits[start + i, :len(found)] = torch.tensor(found, dtype=torch.bool)
    return ranking, hits


def validate(
    model,
    tokenizer,
    dev_examples: Sequence[dict],
    *,
    corpus: tuple[list[str], list[str], list[str]] | None,
    use_answers: bool,
    cfg: dict,
    encoding: DevEncoding,
    return_vectors: bool = False,
    passage_vectors: torch.Tensor | None = None,
    tokens: Mapping[str, Any] | None = None,
) -> dict | tuple[dict, torch.Tensor | None]:
    """All validation metrics for the current weights (the model is put back in training mode).

    ``cfg``: the ``val_*`` keys of a ``TrainConfig`` (a mapping); ``encoding``: the lengths and autocast the dev
    texts are encoded with (its batch size is ``cfg``'s ``val_batch_size`` where ``cfg`` has one).

    ``return_vectors``: also return the corpus vectors it encoded (corpus negatives reuse them);
    ``passage_vectors``: the corpus vectors of the current passage tower when the caller has them.

    Questions and the corpus are encoded once; the average-rank pool reuses the corpus vectors of
    its passages (the dev pool is a subset of the corpus), which halves the cost of a validation.
    ``tokens``: token tables (`dpr.models.token_cache`) of the dev ``questions`` and of the ``corpus``, tokenised
    once for every validation of a run (the same token ids, so the same vectors).
    """
    tokens = tokens or {}
    was_training = model.training
    model.eval()
    try:
        examples = _select(dev_examples, int(cfg.get("val_max_questions", 0) or 0))
        if not examples:
            return ({}, None) if return_vectors else {}
        encoding = dataclasses.replace(encoding, batch_size=int(cfg.get("val_batch_size", encoding.batch_size)))
        q = encoding.encode(model, tokenizer, [ex["question"] for ex in examples], "question",
                            tokens=tokens.get("questions"))
        p = passage_vectors
        if corpus is not None and p is None:
            p = encoding.encode(model, tokenizer, corpus[1], "passage", titles=corpus[2], tokens=tokens.get("corpus"))
        metrics = average_rank(model, tokenizer, examples, hard_negatives=int(cfg.get("val_hard_negatives", 30)),
                               encoding=encoding, question_vectors=q,
                               known_passages=(corpus[0], p) if p is not None else None)
        if corpus is not None:
            metrics.update(corpus_topk_accuracy(
                model, tokenizer, examples, corpus, ks=list(cfg.get("val_topk", (1, 5, 20))),
                use_answers=use_answers, encoding=encoding, question_vectors=q, passage_vectors=p,
            ))
    finally:
        model.train(was_training)
    return (metrics, p) if return_vectors else metrics


class Validator:
    """Dev validation as the trainer uses it: names its primary metric and whether greater is better."""

    def __init__(self, tokenizer, dev_examples: Sequence[dict], *, corpus, use_answers: bool, cfg: Any,
                 encoding: DevEncoding, primary_metric: str, tokens: Mapping[str, Any] | None = None) -> None:
        """``cfg``: the run's typed ``TrainConfig`` (its ``val_*`` keys; a mapping of them works too); ``encoding``:
        the dev texts' lengths and autocast; ``tokens``: the dev questions' and the corpus's token tables
        (:func:`validate`)."""
        self.tokenizer, self.examples, self.corpus = tokenizer, list(dev_examples), corpus
        self.tokens = dict(tokens or {})
        cfg = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg or {})
        self.use_answers, self.cfg, self.encoding = use_answers, cfg, encoding
        self.primary_metric = primary_metric
        self.greater_is_better = greater_is_better(primary_metric)
        # refused here, before a step is trained, rather than at the first validation
        available = [m.name for m in dev_metrics(cfg.get("val_topk", (1, 5, 20)))  # validate()'s default
                     if m.applies(corpus=corpus is not None, graded=not use_answers)]
        if self.examples and primary_metric not in available:
            raise ValueError(f"train.best_metric={primary_metric!r}: this run's dev validation computes "
                             f"{', '.join(available)} (top<k> needs the passages file and train.val_corpus_topk, "
                             "ndcg@10 qrels data)")

    def __bool__(self) -> bool:
        return bool(self.examples)

    def __call__(self, model, passage_vectors: torch.Tensor | None = None) -> tuple[dict, torch.Tensor | None]:
        """``(metrics, corpus vectors or None)`` for the current weights (``passage_vectors``: the corpus
        encoded by the current passage tower, when the caller knows it has not changed)."""
        return validate(model, self.tokenizer, self.examples, corpus=self.corpus, use_answers=self.use_answers,
                        cfg=self.cfg, encoding=self.encoding, return_vectors=True, passage_vectors=passage_vectors,
                        tokens=self.tokens)

    def metric(self, metrics: dict) -> str:
        if self.primary_metric not in metrics:  # TrainConfig refuses such names: this is a bug, not a fallback
            raise ValueError(f"train.best_metric={self.primary_metric!r}: the dev validation gave no such metric "
                             f"(it gave {', '.join(sorted(k for k in metrics if not k.endswith('_ci95')))})")
        return self.primary_metric

    def is_better(self, metric: str, value: float, best: float | None) -> bool:
        if not math.isfinite(float(value)):  # NaN compares false both ways: it must never become the best
            return False
        if best is None:
            return True
        return value > best if greater_is_better(metric) else value < best
