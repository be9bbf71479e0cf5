"""``dpr-rerank score``: one first stage's results file reranked by a cross-encoder, by the pipeline's rule.

The input is a DPR results JSON or a TREC run (pyserini's and the pipeline's format on qrels data; its
query and passage texts come from the dataset's queries.jsonl and passages.tsv). Each question's top ``k``
is ordered by the cross-encoder's logit, or with ``weight`` > 0 by minmax(logit) + weight * minmax(first
stage score) (`dpr.rerank.runs.reranked`, what the pipeline's ``+rerank`` rows are); the rest of the list
follows as it was, so every depth past ``k`` scores the same passages as the first stage.

``weight_grid`` scores each pair once and measures every weight against the answers (QA data) or the qrels
given: the file is written with the best one (the rerank_dev stage's rule, ties to the smaller weight).
That is a choice made on the file it is measured on: use it on a dev split, then pass the weight on test.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from dpr.atomic import write_json
from dpr.output_sets import atomic_paths, file_manifest
from dpr.eval.ranking import results_metrics
from dpr.rerank.config import RerankScoreConfig
from dpr.rerank.model import load_cross_encoder
from dpr.rerank.runs import choose_weight, first_stage_records, pair_scores, reranked, write_reranked
from dpr.trainkit.precision import resolve_precision

log = logging.getLogger(__name__)


def stats_path(output: str | Path) -> Path:
    """Where the stats of ``output`` are written: ``<output stem>.stats.json`` beside it."""
    output = Path(output)
    return output.with_name(output.stem + ".stats.json")


def write_reranked_set(records: list[dict], json_out: Path, trec_out: Path | None, stats_out: Path, stats: dict,
                       tag: str = "rerank") -> None:
    """The reranked list (JSON, and the TREC run when ``trec_out``) and its stats as one set
    (`dpr.output_sets.atomic_paths`): written aside, moved in with the stats last, which name the lists by size and
    hash (``files``; `dpr.eval.report.check_results_set` checks them before a list is evaluated)."""
    lists = [json_out, *([trec_out] if trec_out is not None else [])]
    with atomic_paths([*lists, stats_out]) as tmps:
        write_reranked(records, tmps[0], tmps[1] if trec_out is not None else None, tag=tag)
        write_json(tmps[-1], {**stats, "files": file_manifest({p.name: t for p, t in zip(lists, tmps)})})


def _metric_name(qrels: Mapping | None) -> str:
    return "ndcg@10" if qrels is not None else "mrr"


def rerank_file(model_dir: str | Path, results_path: str | Path, output: str | Path,
                score: RerankScoreConfig | None = None, *, weight: float = 0.0,
                weight_grid: Sequence[float] | None = None, queries: Mapping[str, str] | None = None,
                passages: Any = None, qrels: Mapping[str, Mapping[str, int]] | None = None,
                **score_fields: Any) -> dict:
    """Rerank ``results_path`` into ``output`` (DPR results JSON; ``.trec``: a TREC run, with the JSON beside
    it as ``<stem>.json``) and write its stats beside it (:func:`stats_path`), the three as one set
    (:func:`write_reranked_set`); returns the stats: timings,
    the weight used and, with answers or ``qrels``, the metrics before and after (and per grid weight).

    ``score``: how (the top ``k``, ``batch_size``, ``precision``, ``max_questions``: `RerankScoreConfig`, ``rerank.score``;
    its fields may also be given as keywords, which override it). ``queries`` / ``passages`` (id -> text, a
    `dpr.data.passages.PassageLookup`): the texts of a TREC run."""
    score = dataclasses.replace(score or RerankScoreConfig(), **score_fields)
    k = score.k
    output, results_path = Path(output), Path(results_path)
    trec_out = output if output.suffix == ".trec" else None
    json_out = output.with_suffix(".json") if trec_out is not None else output
    records = first_stage_records(results_path, queries, passages)  # a bad file fails before the model loads
    if score.max_questions > 0:
        records = records[:score.max_questions]
    if trec_out is not None and any("query_id" not in r for r in records):
        raise ValueError(f"{results_path}: a TREC output needs each record's query_id (a TREC run or qrels "
                         "data's results as input)")
    measured = qrels is not None or any(r["answers"] for r in records)
    if weight_grid and not measured:
        raise ValueError(f"{results_path}: weight_grid needs answers (QA data) or qrels= to choose a weight by")
    metric = _metric_name(qrels)

    def metrics(recs: list[dict]) -> dict:
        # QA: the first k only (top-20 of a reranked top 5 says nothing); qrels: the list as written
        if qrels is not None:
            return results_metrics(recs, qrels)
        return results_metrics([{**r, "ctxs": r["ctxs"][:k]} for r in recs], max_k=k)

    model, tok, settings = load_cross_encoder(model_dir)
    t0 = time.perf_counter()
    scores = pair_scores(model, tok, settings, [records], k, batch_size=score.batch_size, precision=score.precision)
    seconds = time.perf_counter() - t0
    stats: dict[str, Any] = {"questions": len(records), "k": k, "pairs": len(scores),
                             "precision": resolve_precision(score.precision, next(model.parameters()).device),
                             "device": str(next(model.parameters()).device), "seconds": round(seconds, 2),
                             "seconds_per_question": round(seconds / max(1, len(records)), 4)}
    if weight_grid:
        by_weight = {float(w): metrics(reranked(records, scores, k, float(w))) for w in weight_grid}
        weight = choose_weight(by_weight, metric)
        stats["by_weight"] = {str(w): m for w, m in by_weight.items()}
    out = reranked(records, scores, k, float(weight))
    stats["weight"] = float(weight)
    if measured:
        stats["metric"] = metric
        stats["before"], stats["after"] = metrics(records), metrics(out)
    write_reranked_set(out, json_out, trec_out, stats_path(output),
                       {"results": str(results_path), "cross_encoder": str(model_dir), **stats})
    log.info("reranked %d questions (top %d, weight %g) in %.1f s: %.3f s per question", len(records), k,
             stats["weight"], seconds, stats["seconds_per_question"])
    return stats
