"""Hybrid retrieval arithmetic: fuse a BM25 ranking with a dense one, per question.

Linear fusion: ``score = dense + w · bm25``. DPR's hybrid added λ·BM25 to raw dot products, which only
works for one model's score scale (DPR's dot products are ~80, a cosine model's are ≤ 1, BM25 is
~10-30), so a weight tuned for one model means nothing for the next. We min-max normalise each list
per question to [0, 1] by default (``normalize="minmax"``; ``"none"`` keeps raw scores, as DPR). A
passage missing from one list gets that list's minimum for the question (0 after min-max): it was
not retrieved, so it is scored as the worst thing that was.

Reciprocal rank fusion: ``Σ 1 / (k_rrf + rank)`` over the lists that hold the passage (rank from 1,
k_rrf = 60 as in Cormack et al. 2009); scale-free, nothing to tune.

Ties (equal fused scores) are broken by the better dense rank, then the better BM25 rank, then the
passage id, so fused orders are deterministic.

Weights are finite and in [0, MAX_WEIGHT = 1e6] (`dpr.checks`: min-max scores lie in [0, 1] and raw scores
are float32, so ``w · bm25`` cannot overflow float64), ``k_rrf`` in [0, 1e6], ``k`` an integer >= 1; each
is checked before any work, with one line naming the argument.

Inputs are DPR results (a list of ``{question, answers, ctxs}``, aligned by position), TREC runs
(``{qid: {docid: score}}``) or paths to either (``.json`` = results, anything else = TREC run).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Sequence, Union

import numpy as np

from dpr.checks import MAX_K, MAX_K_RRF, MAX_WEIGHT, check_float, check_int
from dpr.config import ranged, ranged_list
from dpr.errors import DataError

log = logging.getLogger(__name__)

Results = list[dict]
Run = dict[str, dict[str, float]]
Source = Union[Results, Run, str, Path]

NORMALIZE = ("minmax", "none")
FUSIONS = ("linear", "rrf")
TUNE_METRICS = ("topk", "mrr")


@dataclass
class HybridConfig:
    """How the hybrid is fused and its weight tuned: the one source of these defaults for ``dpr-retrieve
    mode=hybrid`` (the keys at its root), ``dpr-pipeline`` (its ``hybrid`` section) and the functions below.
    Registered in Hydra's ConfigStore as ``hybrid_cfg/default`` (`register_schema`)."""

    # the weights tried on dev: fine below 1 (where min-max-normalised BM25 helps most), coarse up to 5
    grid: List[float] = ranged_list(0.0, MAX_WEIGHT,
                                    default=lambda: [0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0])
    metric: str = "mrr"       # tune by dev MRR@metric_k (topk: top-k accuracy / Recall@k, saturates near 98%)
    metric_k: int = ranged(100, 1, MAX_K)
    normalize: str = "minmax"  # minmax (per question, to [0, 1]) | none (raw scores, as DPR)
    k_rrf: float = ranged(60, 0.0, MAX_K_RRF)  # reciprocal rank fusion's k (Cormack et al. 2009)


def register_schema() -> None:
    """``hybrid_cfg/default``: HybridConfig's defaults, for conf/retrieve.yaml and conf/pipeline.yaml to select."""
    from dpr.config import register_defaults

    register_defaults("hybrid_cfg", "default", HybridConfig)


_DEFAULTS = HybridConfig()
DEFAULT_GRID = list(_DEFAULTS.grid)
DEFAULT_K_RRF = _DEFAULTS.k_rrf


# ------------------------------------------------------------------------------------------ arguments

def check_weight(weight: Any, name: str = "weight") -> float:
    """A linear fusion weight: finite, in [0, 1e6] (see the module docstring for why that cannot overflow)."""
    return check_float(name, weight, 0.0, MAX_WEIGHT)


def check_k_rrf(k_rrf: Any) -> float:
    return check_float("k_rrf", k_rrf, 0.0, MAX_K_RRF)


def check_normalize(method: Any) -> str:
    if method not in NORMALIZE:
        raise ValueError(f"normalize must be one of {NORMALIZE}, got {method!r}")
    return method


def check_grid(grid: Any) -> list[float]:
    if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence):
        raise TypeError(f"grid must be a list of weights, got {type(grid).__name__}")
    if not grid:
        raise ValueError("the weight grid is empty")
    return [check_weight(w, f"grid[{i}]") for i, w in enumerate(grid)]


def _check_how(weight: Any, k_rrf: Any, normalize: str) -> dict[str, Any]:
    if (weight is None) == (k_rrf is None):
        raise ValueError("give exactly one of weight (linear fusion) or k_rrf (reciprocal rank fusion)")
    if k_rrf is not None:
        return {"k_rrf": check_k_rrf(k_rrf)}
    return {"weight": check_weight(weight), "normalize": check_normalize(normalize)}


# ---------------------------------------------------------------------------------------- one question

def normalize_scores(scores: Sequence[float], method: str = "minmax") -> np.ndarray:
    """Per-question normalisation: ``minmax`` → [0, 1] (all equal → all 0), ``none`` → unchanged."""
    check_normalize(method)
    arr = np.asarray(scores, dtype=np.float64)
    if method == "none" or arr.size == 0:
        return arr
    lo, hi = arr.min(), arr.max()
    return (arr - lo) / (hi - lo) if hi > lo else np.zeros_like(arr)


class _Candidates:
    """The union of two ranked lists for one question, ready for any fusion weight."""

    def __init__(self, bm25_ranked: Sequence[tuple[str, float]], dense_ranked: Sequence[tuple[str, float]],
                 normalize: str = "minmax") -> None:
        b_ids = [pid for pid, _ in bm25_ranked]
        d_ids = [pid for pid, _ in dense_ranked]
        b_norm = normalize_scores([s for _, s in bm25_ranked], normalize)
        d_norm = normalize_scores([s for _, s in dense_ranked], normalize)
        # a list repeating a passage keeps its first (best) occurrence
        b_rank: dict[str, int] = {}
        for r, pid in enumerate(b_ids, 1):
            b_rank.setdefault(pid, r)
        d_rank: dict[str, int] = {}
        for r, pid in enumerate(d_ids, 1):
            d_rank.setdefault(pid, r)
        self.ids = list(dict.fromkeys(d_ids + b_ids))
        b_min = float(b_norm.min()) if b_norm.size else 0.0
        d_min = float(d_norm.min()) if d_norm.size else 0.0
        self.bm25 = np.array([b_norm[b_rank[p] - 1] if p in b_rank else b_min for p in self.ids])
        self.dense = np.array([d_norm[d_rank[p] - 1] if p in d_rank else d_min for p in self.ids])
        inf = math.inf
        self.bm25_rank = np.array([b_rank.get(p, inf) for p in self.ids], dtype=np.float64)
        self.dense_rank = np.array([d_rank.get(p, inf) for p in self.ids], dtype=np.float64)
        order = sorted(range(len(self.ids)), key=lambda i: (self.dense_rank[i], self.bm25_rank[i], self.ids[i]))
        self.tiebreak = np.empty(len(self.ids), dtype=np.int64)
        self.tiebreak[order] = np.arange(len(self.ids))

    def linear(self, weight: float) -> np.ndarray:
        return self.dense + weight * self.bm25

    def rrf(self, k_rrf: float) -> np.ndarray:
        # 1/(k+inf) = 0: a list that misses the passage contributes nothing
        return 1.0 / (k_rrf + self.dense_rank) + 1.0 / (k_rrf + self.bm25_rank)

    def order(self, scores: np.ndarray) -> np.ndarray:
        """Indices best first: higher score, then the tie-break order."""
        return np.lexsort((self.tiebreak, -scores))


# ------------------------------------------------------------------------------------ loading, saving

def _load(source: Source) -> Results | Run:
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.suffix == ".json":
            from dpr.data.results import read_results

            return read_results(path)
        from dpr.data.results import read_trec_run

        return read_trec_run(path)
    return source


def _is_run(obj: Results | Run) -> bool:
    return isinstance(obj, Mapping)


def _ranked_ctxs(result: dict) -> list[tuple[str, float]]:
    return [(str(c["id"]), float(c["score"])) for c in result.get("ctxs", [])]


def _ranked_run(docs: Mapping[str, float]) -> list[tuple[str, float]]:
    return sorted(((d, float(s)) for d, s in docs.items()), key=lambda x: (-x[1], x[0]))


def _aligned(bm25: Results, dense: Results) -> list[tuple[dict, dict]]:
    """Pair results by position; both lists must ask the same questions in the same order."""
    if len(bm25) != len(dense):
        raise DataError(None, f"BM25 results hold {len(bm25)} questions but dense results {len(dense)}",
                        field="question")
    for i, (b, d) in enumerate(zip(bm25, dense)):
        if b["question"] != d["question"]:
            raise DataError(None, f"question {i} differs: BM25 {b['question']!r} vs dense {d['question']!r}",
                            line=i, field="question")
    return list(zip(bm25, dense))


def _pair_inputs(bm25: Source, dense: Source) -> tuple[Results | Run, Results | Run]:
    b, d = _load(bm25), _load(dense)
    if _is_run(b) != _is_run(d):
        raise ValueError("cannot fuse DPR results with a TREC run: give both in the same format")
    return b, d


def _write(output: str | Path | None, fused: Results | Run, tag: str) -> None:
    if output is None:
        return
    if _is_run(fused):
        from dpr.data.results import write_trec_run

        write_trec_run(output, fused, tag)
    else:
        from dpr.data.results import write_results

        write_results(output, fused)


# --------------------------------------------------------------------------------------------- fusion

def _check_finite(ranked: Sequence[tuple[str, float]], which: str, question: str | None = None) -> None:
    """A NaN or infinite input score is refused: min-max over it is NaN, and ``nan > nan`` is false, so the
    question's whole first-stage term would silently become 0 (a ranking by the other list alone)."""
    for pid, score in ranked:
        if not math.isfinite(score):
            about = f"question {question!r}, " if question is not None else ""
            raise ValueError(f"{which} score {score!r} is not a finite number ({about}passage {pid!r})")


def fuse_ranked(bm25_ranked: Sequence[tuple[str, float]], dense_ranked: Sequence[tuple[str, float]], k: int, *,
                weight: float | None = None, k_rrf: float | None = None,
                normalize: str = "minmax") -> list[tuple[str, float]]:
    """One question's fused top ``k`` as ``(passage id, score)``, best first: linear fusion with
    ``weight``, or reciprocal rank fusion with ``k_rrf`` (exactly one of them). The one fusion rule
    behind the file functions below and `dpr.retrieval.HybridRetriever`."""
    how = _check_how(weight, k_rrf, normalize)
    k = check_int("k", k, 1, MAX_K)
    _check_finite(bm25_ranked, "BM25")
    _check_finite(dense_ranked, "dense")
    cand = _Candidates(bm25_ranked, dense_ranked, how.get("normalize", "none"))
    scores = cand.rrf(how["k_rrf"]) if "k_rrf" in how else cand.linear(how["weight"])
    if not np.isfinite(scores).all():  # only raw (normalize=none) scores can get here: one not finite
        raise ValueError("fused scores are not finite: an input score is NaN/inf or too large for the weight")
    return [(cand.ids[i], float(scores[i])) for i in cand.order(scores)[:k]]


def _fuse(bm25: Source, dense: Source, k: int, **how: Any) -> Results | Run:
    how = _check_how(how.get("weight"), how.get("k_rrf"), how.get("normalize", "minmax"))
    k = check_int("k", k, 1, MAX_K)  # before the inputs are read
    b, d = _pair_inputs(bm25, dense)
    if _is_run(b):
        for qid in dict.fromkeys(list(d) + list(b)):  # in-memory runs were not checked by a reader
            _check_finite(_ranked_run(b.get(qid, {})), "BM25", qid)
            _check_finite(_ranked_run(d.get(qid, {})), "dense", qid)
        return {qid: dict(fuse_ranked(_ranked_run(b.get(qid, {})), _ranked_run(d.get(qid, {})), k, **how))
                for qid in dict.fromkeys(list(d) + list(b))}
    fused: Results = []
    for br, dr in _aligned(b, d):
        _check_finite(_ranked_ctxs(br), "BM25", br["question"])
        _check_finite(_ranked_ctxs(dr), "dense", dr["question"])
        ctx_by_id = {str(c["id"]): c for c in br.get("ctxs", [])}
        ctx_by_id.update({str(c["id"]): c for c in dr.get("ctxs", [])})
        top = fuse_ranked(_ranked_ctxs(br), _ranked_ctxs(dr), k, **how)
        ctxs = [{**ctx_by_id[pid], "score": score} for pid, score in top]
        fused.append({**{key: v for key, v in dr.items() if key != "ctxs"}, "ctxs": ctxs})
    return fused


def fuse_linear(bm25: Source, dense: Source, weight: float, output: str | Path | None = None, *,
                k: int = 100, normalize: str = "minmax") -> Results | Run:
    """``dense + weight · bm25`` per question, top ``k``; written to ``output`` when given."""
    fused = _fuse(bm25, dense, k, weight=check_weight(weight), normalize=normalize)
    _write(output, fused, f"hybrid_w{weight:g}")
    return fused


def fuse_rrf(bm25: Source, dense: Source, output: str | Path | None = None, *, k: int = 100,
             k_rrf: float = DEFAULT_K_RRF) -> Results | Run:
    """Reciprocal rank fusion ``Σ 1/(k_rrf + rank)``, top ``k``; written to ``output`` when given."""
    fused = _fuse(bm25, dense, k, k_rrf=check_k_rrf(k_rrf))
    _write(output, fused, f"rrf{k_rrf:g}")
    return fused


fuse_runs_linear = fuse_linear  # TREC runs go through the same functions (detected by type or suffix)
fuse_runs_rrf = fuse_rrf


# --------------------------------------------------------------------------------------------- tuning

def _reciprocal_rank(top: np.ndarray) -> float:
    """1 / rank of the first relevant candidate of ``top`` (0 when none is)."""
    hits = np.flatnonzero(top > 0)
    return 1.0 / (hits[0] + 1) if hits.size else 0.0


def _any_hit(top: np.ndarray) -> float:
    return top.max(initial=0.0)


def tune_linear_weight(bm25_dev: Source, dense_dev: Source, grid: Sequence[float] = DEFAULT_GRID,
                       metric_k: int = _DEFAULTS.metric_k, qrels: str | Path | Mapping | None = None,
                       normalize: str = _DEFAULTS.normalize, metric: str = _DEFAULTS.metric) -> tuple[float, list[dict[str, Any]]]:
    """The grid weight with the best dev metric (ties → the smaller weight) and the whole table.

    ``metric="topk"``: QA results: top-``metric_k`` accuracy (a passage with ``has_answer`` in the fused
    top k); TREC runs: Recall@``metric_k`` against ``qrels`` (path or ``{qid: {docid: rel}}``; rel > 0
    counts), averaged over queries with at least one relevant passage.
    ``metric="mrr"``: MRR@``metric_k`` of the first answer-bearing / relevant passage. Top-20 saturates
    near 98% on easy dev sets, so many weights tie there and the tie-break decides; MRR sees every rank.
    """
    grid = check_grid(grid)
    metric_k = check_int("metric_k", metric_k, 1, MAX_K)
    check_normalize(normalize)
    if metric not in TUNE_METRICS:
        raise ValueError(f"metric must be one of {TUNE_METRICS}, got {metric!r}")
    mrr = metric == "mrr"
    b, d = _pair_inputs(bm25_dev, dense_dev)
    per_question: list[tuple[_Candidates, np.ndarray]] = []  # candidates, relevance flag per candidate
    if _is_run(b):
        if qrels is None:
            raise ValueError("tuning on TREC runs needs qrels")
        if not isinstance(qrels, Mapping):
            from dpr.data.beir import read_qrels

            qrels = read_qrels(qrels)
        name = f"mrr@{metric_k}" if mrr else f"recall@{metric_k}"
        for qid, judged in qrels.items():
            relevant = {doc for doc, rel in judged.items() if rel > 0}
            if not relevant:
                continue
            _check_finite(_ranked_run(b.get(qid, {})), "BM25", qid)
            _check_finite(_ranked_run(d.get(qid, {})), "dense", qid)
            cand = _Candidates(_ranked_run(b.get(qid, {})), _ranked_run(d.get(qid, {})), normalize)
            flags = np.array([p in relevant for p in cand.ids], dtype=np.float64) / len(relevant)
            per_question.append((cand, flags))
    else:
        name = f"mrr@{metric_k}" if mrr else f"top{metric_k}"
        for br, dr in _aligned(b, d):
            _check_finite(_ranked_ctxs(br), "BM25", br["question"])
            _check_finite(_ranked_ctxs(dr), "dense", dr["question"])
            cand = _Candidates(_ranked_ctxs(br), _ranked_ctxs(dr), normalize)
            hit = {str(c["id"]) for c in [*br.get("ctxs", []), *dr.get("ctxs", [])] if c.get("has_answer")}
            per_question.append((cand, np.array([p in hit for p in cand.ids], dtype=np.float64)))
    if not per_question:
        raise ValueError("no dev questions to tune the fusion weight on")

    value_of = _reciprocal_rank if mrr else (_any_hit if name.startswith("top") else np.sum)
    table: list[dict[str, Any]] = []
    best_w, best_v = None, -math.inf
    for w in sorted(float(x) for x in grid):
        total = sum(float(value_of(flags[cand.order(cand.linear(w))[:metric_k]])) for cand, flags in per_question)
        value = total / len(per_question)
        table.append({"weight": w, "metric": name, "value": round(value, 6)})
        if value > best_v + 1e-12:  # strictly better: ties keep the smaller weight
            best_w, best_v = w, value
    log.info("fusion weight %.3g: dev %s %.4f (%d questions, grid of %d)", best_w, name, best_v,
             len(per_question), len(table))
    return best_w, table
