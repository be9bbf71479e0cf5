"""``dpr-reader eval`` as a function: a trained reader on gold passages and/or a results file's top k."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Mapping

from dpr.atomic import write_json_atomic
from dpr.data.dataset import DatasetPaths
from dpr.reader.gold import gold_records
from dpr.reader.infer import AnswerRule
from dpr.reader.model import load_reader
from dpr.reader.open_domain import read_records, answer_at_k, read_topk
from dpr.reader.squad_metrics import evaluate

log = logging.getLogger(__name__)


def read_kwargs(ecfg: Mapping[str, Any]) -> dict:
    return {k: ecfg[k] for k in ("max_answer_length", "n_best", "batch_size", "precision")}


def answer_rule(ecfg: Mapping[str, Any], retrieved: bool = True) -> AnswerRule:
    """How spans of different passages compare (``eval.span_score``, ``eval.passage_weight``,
    ``eval.rank_weight``); ``retrieved=False`` (gold passages: no retriever order) drops the rank prior."""
    return AnswerRule(str(ecfg["span_score"]), float(ecfg["passage_weight"]),
                      float(ecfg["rank_weight"]) if retrieved else 0.0)


def limit(records: list, max_questions: int) -> list:
    return records[:max_questions] if max_questions and max_questions > 0 else records


def gold_scores(model, tokenizer, settings: dict, records: list[dict], ecfg: Mapping[str, Any],
                cache: dict | None = None) -> tuple[dict, list[str]]:
    """EM/F1 reading each question's gold passages (the best span across them when several)."""
    depth = max((len(r["ctxs"]) for r in records), default=1) or 1
    readings = read_records(model, tokenizer, settings, records, depth, cache, **read_kwargs(ecfg))
    preds = answer_at_k(readings, depth, answer_rule(ecfg, retrieved=False))
    return evaluate(preds, [r["answers"] for r in records]), preds


def evaluate_reader(rcfg: Mapping[str, Any], model_dir: Path, output: Path, results: Path | None = None,
                    gold: tuple[DatasetPaths, str] | None = None) -> dict:
    """Write ``output`` (figures, predictions, wall time) and return it."""
    from dpr.data.results import read_results

    ecfg = rcfg["eval"]
    t0 = time.perf_counter()
    model, tokenizer, settings = load_reader(model_dir)
    out: dict = {"model": str(model_dir), "figures": {}, "predictions": {}}
    if gold is not None:
        ds, split = gold
        records, how = gold_records(ds, split, results)
        figures, preds = gold_scores(model, tokenizer, settings, records, ecfg)
        out["figures"]["gold"] = figures
        out["predictions"]["gold"] = preds
        out["gold_passages"] = how
        out["num_gold_questions"] = len(records)
    if results is not None:
        records = limit(read_results(results), int(ecfg.get("max_questions", 0)))
        res = read_topk(model, tokenizer, settings, records, ks=list(ecfg["ks"]),
                        rule=answer_rule(ecfg), **read_kwargs(ecfg))
        out["results"] = str(results)
        out["num_questions"] = len(records)
        out["figures"]["open_domain"] = res["k"]
        out["top_k"] = res["top_k"]
        out["em_above_bound"] = res["em_above_bound"]
        out["predictions"]["open_domain"] = res["predictions"]
    out["seconds"] = round(time.perf_counter() - t0, 1)
    write_json_atomic(output, out)
    log.info("reader evaluation written to %s (%.0f s)", output, out["seconds"])
    return out
