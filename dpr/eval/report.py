"""Side-by-side evaluation of retrieval systems: ``report.json``, ``report.md`` and ``topk.png``, one set (written
aside, moved in with report.json last naming the other two; :func:`read_report` checks them).

QA data (DPR results JSON): top-k accuracy with has_answer recomputed, bootstrap CIs, paired tests and
the overlap of questions hit at k=20. Qrels data (TREC runs): nDCG@10, MRR@10, Recall@10/100 with CIs
and paired tests.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import defaultdict, deque
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from dpr.atomic import write_json
from dpr.output_sets import atomic_paths, check_file_manifest, file_manifest
from dpr.errors import DataError
from dpr.eval import stats
from dpr.eval.plot import plot_curves
from dpr.eval.config import EvalConfig
from dpr.eval.qrels_metrics import DEFAULT_METRICS, per_query_metrics
from dpr.eval.report_md import render_qa_markdown, render_qrels_markdown
from dpr.eval.topk import DEFAULT_KS, first_hit_ranks, hits_at, min_num_ctxs

log = logging.getLogger(__name__)

UPPER_BOUND_NOTE = (
    "Top-k accuracy is the share of questions with an answer string in the top k retrieved passages. "
    "It bounds a reader's exact match: a reader that reads k passages can only answer what is in them."
)
OVERLAP_K = 20
REPORT_FILE, MARKDOWN_FILE, PLOT_FILE = "report.json", "report.md", "topk.png"
RECALL_CURVE_KS = (1, 2, 3, 5, 10, 20, 30, 50, 100, 200, 500, 1000)


def system_names(paths: Sequence[str | Path], names: Sequence[str] | None = None) -> list[str]:
    """``names`` if given (one per file), else each file's stem; clashing stems get their folder's name."""
    if names:
        if len(names) != len(paths):
            raise ValueError(f"names has {len(names)} entries but there are {len(paths)} results files")
        chosen = [str(n) for n in names]
    else:
        stems = [Path(p).stem for p in paths]
        chosen = [f"{Path(p).parent.name}/{s}" if stems.count(s) > 1 else s for p, s in zip(paths, stems)]
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"system names are not unique: {chosen}; pass names=[...]")
    return chosen


def align_questions(records_by_system: Mapping[str, tuple[Path, list[dict]]]) -> dict[str, list[dict]]:
    """Put every system's records in the first system's question order; refuse different question sets.

    Files written by different retrievers may order questions differently, so records are matched by
    question text (duplicates matched in order). Answers must agree too: the hit test depends on them.
    """
    items = list(records_by_system.items())
    _, (ref_path, ref) = items[0]
    ref_questions = [r["question"] for r in ref]
    aligned = {items[0][0]: ref}
    for name, (path, recs) in items[1:]:
        questions = [r["question"] for r in recs]
        if questions == ref_questions:
            order = list(range(len(recs)))
        else:
            positions: dict[str, deque] = defaultdict(deque)
            for j, q in enumerate(questions):
                positions[q].append(j)
            order = []
            for i, q in enumerate(ref_questions):
                if not positions[q]:
                    raise DataError(path, f"question set differs from {ref_path}: its record {i} question {q!r} "
                                          f"is not in {path}", field="question")
                order.append(positions[q].popleft())
            left = sorted(j for dq in positions.values() for j in dq)
            if left:
                raise DataError(path, f"question set differs from {ref_path}: question {questions[left[0]]!r} "
                                      f"is not in {ref_path}", line=f"record {left[0]}", field="question")
        for i, j in enumerate(order):
            if list(recs[j]["answers"]) != list(ref[i]["answers"]):
                raise DataError(path, f"answers for question {ref_questions[i]!r} differ from {ref_path} "
                                      f"({recs[j]['answers']!r} vs {ref[i]['answers']!r})",
                                line=f"record {j}", field="answers")
        aligned[name] = [recs[j] for j in order]
    return aligned


def _pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    return list(itertools.combinations(names, 2))


def _ci_dict(keys: Sequence[Any], lo: np.ndarray, hi: np.ndarray) -> dict[str, list[float]]:
    return {str(k): [float(a), float(b)] for k, a, b in zip(keys, lo, hi)}


def compare_per_item(
    values: Mapping[str, np.ndarray],
    columns: Sequence[Any],
    num_resamples: int = stats.DEFAULT_RESAMPLES,
    seed: int = stats.DEFAULT_SEED,
    level: float = 0.95,
) -> tuple[dict[str, dict], list[dict]]:
    """CIs per system and column, and paired tests per pair of systems, from per-item values.

    ``values[system]`` is ``[num_items, len(columns)]``. One set of bootstrap draws serves all systems,
    so the pair differences are paired bootstraps.
    """
    names = list(values)
    stacked = np.concatenate([np.asarray(values[n], dtype=np.float64) for n in names], axis=1)
    samples = stats.bootstrap_means(stacked, num_resamples=num_resamples, seed=seed)
    lo, hi = stats.confidence_interval(samples, level=level)
    width = len(columns)
    per_system = {n: {"ci": _ci_dict(columns, lo[i * width:(i + 1) * width], hi[i * width:(i + 1) * width])}
                  for i, n in enumerate(names)}
    pairs = []
    for a, b in _pairs(names):
        ia, ib = names.index(a), names.index(b)
        per_col = {}
        for c, col in enumerate(columns):
            va, vb = values[a][:, c], values[b][:, c]
            delta = float(va.mean() - vb.mean()) if len(va) else 0.0
            per_col[str(col)] = {
                "delta": delta,
                "p_bootstrap": stats.paired_bootstrap_pvalue(samples[:, ia * width + c], samples[:, ib * width + c], delta),
                "p_sign": stats.sign_test_pvalue(va, vb),
            }
        pairs.append({"a": a, "b": b, "metrics": per_col})
    return per_system, pairs


def evaluate_qa(
    results_by_system: Mapping[str, str | Path],
    output_dir: str | Path,
    ks: Iterable[int] = DEFAULT_KS,
    match: str = EvalConfig.match,
    notes: Mapping[str, Any] | None = None,
    num_resamples: int = stats.DEFAULT_RESAMPLES,
    seed: int = stats.DEFAULT_SEED,
) -> dict:
    """Evaluate DPR results files side by side and write the report; returns the report dict."""
    from dpr.data.results import read_results

    ks = sorted({int(k) for k in ks})
    if not results_by_system:
        raise ValueError("no results files to evaluate")
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive integers, got {ks}")
    paths = {name: Path(p) for name, p in results_by_system.items()}
    for path in paths.values():
        check_results_set(path)
    loaded = {name: (path, read_results(path)) for name, path in paths.items()}
    aligned = align_questions(loaded)
    num_questions = len(next(iter(aligned.values())))
    if num_questions == 0:
        raise DataError(next(iter(paths.values())), "no questions in the results file", line="record 0")

    hits: dict[str, np.ndarray] = {}
    systems: dict[str, dict] = {}
    for name, records in aligned.items():
        ranks = first_hit_ranks(records, match=match, max_k=max(ks), desc=f"has_answer [{name}]")
        hits[name] = hits_at(ranks, ks)
        depth = min_num_ctxs(records)
        if depth < max(ks):
            log.warning("%s: some questions have only %d passages; top-k above %d uses what is there",
                        name, depth, depth)
        systems[name] = {
            "file": str(paths[name]),
            "top_k": {str(k): float(hits[name][:, j].mean()) for j, k in enumerate(ks)},
            "min_ctxs": depth,
        }
    per_system, pairs = compare_per_item(hits, ks, num_resamples=num_resamples, seed=seed)
    for name in systems:
        systems[name]["ci95"] = per_system[name]["ci"]

    k_overlap = OVERLAP_K if OVERLAP_K in ks else max(ks)
    comparisons = []
    for pair in pairs:
        ov = stats.overlap(hits[pair["a"]][:, ks.index(k_overlap)], hits[pair["b"]][:, ks.index(k_overlap)])
        comparisons.append({"a": pair["a"], "b": pair["b"], "top_k": pair["metrics"],
                            "overlap": {"k": k_overlap, **ov}})

    report = {
        "kind": "qa",
        "num_questions": num_questions,
        "match": match,
        "ks": ks,
        "systems": systems,
        "comparisons": comparisons,
        "bootstrap": {"resamples": num_resamples, "seed": seed, "level": 0.95,
                      "test": "paired bootstrap (two-sided, null-centred) and exact sign test (McNemar)"},
        "note": UPPER_BOUND_NOTE,
        "notes": dict(notes or {}),
    }
    return _write(report, output_dir, render_qa_markdown(report),
                  {n: {k: float(hits[n][:, j].mean()) for j, k in enumerate(ks)} for n in hits},
                  ylabel="top-k accuracy")


def evaluate_qrels(
    runs_by_system: Mapping[str, str | Path],
    qrels_path: str | Path,
    output_dir: str | Path,
    metrics: Iterable[str] = DEFAULT_METRICS,
    notes: Mapping[str, Any] | None = None,
    num_resamples: int = stats.DEFAULT_RESAMPLES,
    seed: int = stats.DEFAULT_SEED,
) -> dict:
    """Evaluate TREC runs against qrels side by side and write the report; returns the report dict."""
    from dpr.data.beir import read_qrels
    from dpr.data.results import read_trec_run

    metrics = list(metrics)
    if not runs_by_system:
        raise ValueError("no run files to evaluate")
    qrels = read_qrels(qrels_path)
    paths = {name: Path(p) for name, p in runs_by_system.items()}
    for path in paths.values():
        check_results_set(path)
    runs = {name: read_trec_run(path) for name, path in paths.items()}
    ref_name = next(iter(runs))
    for name, run in runs.items():
        if set(run) != set(runs[ref_name]):
            first = sorted(set(run) ^ set(runs[ref_name]))[0]
            where = paths[name] if first in runs[ref_name] else paths[ref_name]
            raise DataError(paths[name], f"query set differs from {paths[ref_name]}: query {first!r} "
                                         f"is missing from {where}", field="query-id")
    if not set(qrels) & set(runs[ref_name]):
        raise DataError(qrels_path, f"no query of the qrels is in the run {paths[ref_name]}", field="query-id")

    curve_ks = [k for k in RECALL_CURVE_KS if k <= max(len(d) for r in runs.values() for d in r.values())] or [1]
    values, systems, curves = {}, {}, {}
    for name, run in runs.items():
        query_ids, per_q = per_query_metrics(run, qrels, metrics)
        values[name] = np.stack([per_q[m] for m in metrics], axis=1)
        _, rec = per_query_metrics(run, qrels, [f"recall@{k}" for k in curve_ks])
        curves[name] = {k: float(rec[f"recall@{k}"].mean()) for k in curve_ks}
        systems[name] = {"file": str(paths[name]), **{m: float(per_q[m].mean()) for m in metrics}}
    per_system, pairs = compare_per_item(values, metrics, num_resamples=num_resamples, seed=seed)
    for name in systems:
        systems[name]["ci95"] = per_system[name]["ci"]
    report = {
        "kind": "qrels",
        "num_queries": len(qrels),
        "qrels": str(qrels_path),
        "metrics": metrics,
        "systems": systems,
        "comparisons": [{"a": p["a"], "b": p["b"], "metrics": p["metrics"]} for p in pairs],
        "bootstrap": {"resamples": num_resamples, "seed": seed, "level": 0.95,
                      "test": "paired bootstrap (two-sided, null-centred) and exact sign test"},
        "note": "Metrics as trec_eval computes them (relevant: qrels score >= 1; nDCG gain: the graded score). "
                "Queries are those of the qrels file.",
        "notes": dict(notes or {}),
    }
    return _write(report, output_dir, render_qrels_markdown(report), curves, ylabel="Recall@k")


def add_reader(report: dict, reader: Mapping[str, Any], details: Mapping[str, Any], output_dir: str | Path) -> dict:
    """The reader beside the bound: ``report["reader"]`` (``{"gold", "systems"}``, see dpr.reader.pipeline),
    its counts and wall time under ``notes["reader"]``; rewrites report.json/.md and topk.png (reader
    EM drawn dashed next to each system's top-k curve). Returns the new report."""
    report = {**report, "reader": dict(reader), "notes": {**report.get("notes", {}), "reader": dict(details)}}
    curves = {n: {int(k): v for k, v in s["top_k"].items()} for n, s in report["systems"].items()}
    em_curves = {f"{n} reader EM": {int(k): v["em"] for k, v in per_k.items()} for n, per_k in reader["systems"].items()}
    return _write(report, output_dir, render_qa_markdown(report), {**curves, **em_curves},
                  ylabel="top-k accuracy; reader EM (dashed)", dashed=set(em_curves))


def _write(report: dict, output_dir: str | Path, markdown: str, curves: Mapping[str, Mapping[int, float]],
           ylabel: str, dashed: Iterable[str] = ()) -> dict:
    """The report's three files as one set (`dpr.output_sets.atomic_paths`): all written aside, then moved in with
    report.json last, naming the other two by size and hash (``files``; :func:`read_report` checks them).
    Returns the report as written (with ``files``)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_paths([out / PLOT_FILE, out / MARKDOWN_FILE, out / REPORT_FILE]) as (png, md, js):
        plot_curves(curves, png, ylabel=ylabel, dashed=dashed)
        md.write_text(markdown, encoding="utf-8")
        body = {**report, "files": file_manifest({PLOT_FILE: png, MARKDOWN_FILE: md})}
        write_json(js, body)
    log.info("report written to %s", out)
    return body


def read_report(path: str | Path) -> dict:
    """A ``report.json`` whose report.md and topk.png are the ones it was written with (one line naming the file
    otherwise: a dpr-eval killed between its moves, or a file copied in from another report)."""
    path = Path(path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(path, f"invalid JSON: {err.msg}", line=err.lineno) from None
    if not isinstance(report, dict) or report.get("kind") not in ("qa", "qrels"):
        raise DataError(path, "not a dpr-eval report (expected kind 'qa' or 'qrels')", field="kind")
    check_file_manifest(path, report.get("files"), path.parent, "run dpr-eval again to write the report")
    return report


def check_results_set(path: str | Path) -> None:
    """A results file or TREC run written as one set with a stats file (``dpr-rerank score``'s
    ``<stem>.stats.json``, the pipeline's ``stats.json``) is refused in one line unless every file of the set is
    the one that stats file names: a writer killed between its moves leaves a new list beside old stats."""
    path = Path(path)
    for stats in (path.with_name(path.stem + ".stats.json"), path.with_name("stats.json")):
        try:
            body = json.loads(stats.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # no stats beside it, or not ours
            continue
        files = body.get("files") if isinstance(body, dict) else None
        if isinstance(files, dict) and path.name in files:
            check_file_manifest(stats, files, path.parent, "rerank it again (dpr-rerank score, or the pipeline's "
                                "rerank stage) to write the set")
