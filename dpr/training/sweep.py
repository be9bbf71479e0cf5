"""Sweep summary: one table of (config overrides × final metrics) over the runs of a sweep directory.

Each run of a sweep writes ``<sweep_dir>/<run>/train_summary.json`` (with the overrides that made it);
this module gathers them into ``sweep_summary.md``, ``.json`` and ``.csv`` at the sweep directory.
Plain functions: the Hydra callback in :mod:`dpr.cli.train` only calls :func:`write_sweep_summary`.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from pathlib import Path
from typing import Any

from dpr.atomic import write_json_atomic, write_text_atomic

log = logging.getLogger(__name__)

SUMMARY_FILE = "train_summary.json"


def _override_pairs(overrides: list[str]) -> dict[str, str]:
    pairs = {}
    for item in overrides:
        key, sep, value = item.lstrip("+~").partition("=")
        if sep:
            pairs[key] = value
    return pairs


def collect_runs(sweep_dir: str | Path) -> list[dict]:
    """One row per run below ``sweep_dir`` that finished (has a train summary), sorted by job number then path."""
    sweep_dir = Path(sweep_dir)
    rows = []
    for summary_file in sorted(sweep_dir.glob(f"*/{SUMMARY_FILE}")):
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
        metrics = summary.get("final_metrics", {})
        rows.append({
            "run": summary_file.parent.name,
            "job_num": summary.get("job_num"),
            "overrides": _override_pairs(summary.get("overrides") or []),
            "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float)) or v is None},
            "best_step": summary.get("best_step"),
            "steps": summary.get("steps"),
            "wall_time_s": summary.get("wall_time_s"),
        })
    rows.sort(key=lambda r: (r["job_num"] if r["job_num"] is not None else 1 << 30, r["run"]))
    return rows


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def summary_table(rows: list[dict]) -> tuple[list[str], list[list[Any]]]:
    """Header and rows: run, each override key (sweeping keys first), then each metric."""
    keys = sorted({k for r in rows for k in r["overrides"]})
    # keys whose value differs between runs are what the sweep is about: show them first
    varying = [k for k in keys if len({r["overrides"].get(k) for r in rows}) > 1]
    keys = varying + [k for k in keys if k not in varying]
    metric_keys = sorted({k for r in rows for k in r["metrics"]})
    header = ["run", *keys, *metric_keys, "best_step", "steps", "wall_time_s"]
    table = [
        [r["run"], *(r["overrides"].get(k) for k in keys), *(r["metrics"].get(k) for k in metric_keys),
         r["best_step"], r["steps"], r["wall_time_s"]]
        for r in rows
    ]
    return header, table


def write_sweep_summary(sweep_dir: str | Path) -> dict:
    """Write ``sweep_summary.{md,json,csv}`` in ``sweep_dir``; returns the JSON payload."""
    sweep_dir = Path(sweep_dir)
    rows = collect_runs(sweep_dir)
    header, table = summary_table(rows)
    payload = {"sweep_dir": str(sweep_dir), "num_runs": len(rows), "runs": rows}
    write_json_atomic(sweep_dir / "sweep_summary.json", payload)

    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows([[("" if v is None else v) for v in row] for row in table])
    write_text_atomic(sweep_dir / "sweep_summary.csv", buf.getvalue())

    md = [f"# Sweep summary ({len(rows)} runs)", "", f"Sweep directory: `{sweep_dir}`", ""]
    md.append("| " + " | ".join(header) + " |")
    md.append("|" + "---|" * len(header))
    md += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in table]
    write_text_atomic(sweep_dir / "sweep_summary.md", "\n".join(md) + "\n")
    log.info("sweep summary of %d runs: %s", len(rows), sweep_dir / "sweep_summary.md")
    return payload
