#!/usr/bin/env python
"""Ablation of the training pieces on dev: one `dpr-train` run per (dataset, variant), one table.

    DPR_DATA_MIRROR=../shared/data .venv/bin/python scripts/ablate_training.py \
        --datasets squad1_open,sciq_open,nfcorpus --variants all --out runs/ablation

Each run lands in ``<out>/<dataset>/<variant>/`` (a finished run is not redone, so the script can be
stopped and rerun); the table ``<out>/ablation.{md,json,csv}`` gives, per dataset and variant, the dev
figures of the weights the trainer kept (the dev set picks them, and the test split is never read) with
95% intervals, the steps and the wall time. Variants are override lists of `dpr-train`, so any row can be
rerun by hand; ``--extra`` adds overrides to every run (e.g. ``train.precision=fp32``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from script_args import OneLineParser, claim_dir, owned_dir  # scripts/ is on sys.path

REPO = Path(__file__).resolve().parents[1]
MARKER = ".dpr-ablation"  # an ablation's --out: a rerun may write there

# name -> (what it tests, dpr-train overrides). The baseline is the previous default recipe.
# The pipeline's recipe, conf/train/pipeline.yaml (run_variant adds its validate_at_start to every run): the
# variants built on it extend this list, so they cannot drift from it.
DEFAULT_RECIPE = ["model.shared=false", "train.frozen_steps=124", "train.lr=5e-5"]

VARIANTS: dict[str, tuple[str, list[str]]] = {
    "baseline": ("100 two-tower steps x 32, H=1 BM25, no masks (the previous default)", ["train.mask_answers=false"]),
    "masks": ("+ false-negative masks (answer-bearing passages, other positives)", []),
    "corpus": ("+ a second loss term against the whole cached corpus", ["train.corpus_negatives=true"]),
    "frozen": ("frozen index only: question tower, 1 epoch x 64 against the whole corpus",
               ["model.shared=false", "train.frozen_steps=124", "train.max_steps=0", "train.epochs=0",
                "train.batch_size=64"]),
    "frozen_distill": ("frozen index only, + BM25 as a lexical teacher (KL over the whole corpus)",
                       ["model.shared=false", "train.frozen_steps=124", "train.max_steps=0", "train.epochs=0",
                        "train.batch_size=64", "loss=lexical_distill"]),
    "frozen_then_two_tower": ("frozen phase (124 x 32), then the 100 two-tower steps (masks)",
                              ["model.shared=false", "train.frozen_steps=124"]),
    "frozen_tt_lr5e-5": ("frozen_then_two_tower at lr 5e-5 (both phases)", DEFAULT_RECIPE),
    "frozen_tt_corpus": ("frozen_tt_lr5e-5 (the default) + the whole-corpus term in its two-tower steps",
                         [*DEFAULT_RECIPE, "train.corpus_negatives=true"]),
    "frozen_tt_h0_b64": ("frozen_then_two_tower, no BM25 negative, 64 questions a step (same passages per step)",
                         ["model.shared=false", "train.frozen_steps=124", "train.hard_negatives=0",
                          "train.batch_size=64"]),
    "topic_batches": ("frozen_tt_lr5e-5 (the default) with topic-aware batches (TAS-B: one article per batch)",
                      [*DEFAULT_RECIPE, "train.topic_batches=true"]),
    "topic_batches_h0": ("topic_batches without the BM25 negative (32 passages a step)",
                         [*DEFAULT_RECIPE, "train.topic_batches=true", "train.hard_negatives=0"]),
    "distill": ("two-tower steps with BM25 as a lexical teacher over the in-batch pool", ["loss=lexical_distill"]),
    "multi_positive": ("qrels: every judged positive in the pool is a positive, one drawn per epoch",
                       ["train.multi_positive=true", "train.shuffle_positives=true"]),
    "single_positive": ("qrels: the default recipe with one positive per query (its other judged documents "
                        "masked, not positives)", [*DEFAULT_RECIPE, "train.multi_positive=false"]),
    "frozen_lr5e-5": ("frozen index only at lr 5e-5, 124 steps x 64", ["model.shared=false", "train.frozen_steps=124",
                      "train.max_steps=0", "train.epochs=0", "train.batch_size=64", "train.lr=5e-5"]),
    "frozen_single": ("frozen_lr5e-5 with one positive per query (qrels: other judged documents masked)",
                      ["model.shared=false", "train.frozen_steps=124", "train.max_steps=0", "train.epochs=0",
                       "train.batch_size=64", "train.lr=5e-5", "train.multi_positive=false"]),
    "hinge": ("margin loss instead of the softmax NLL", ["loss=hinge"]),
}
METRICS = ("top1", "top5", "top20", "mrr", "avg_rank", "ndcg@10")
QRELS_ONLY = ("multi_positive", "single_positive", "frozen_single")  # one positive per question on QA data: nothing to vary


def run_variant(dataset: str, name: str, overrides: list[str], out: Path, data_dir: str, extra: list[str]) -> dict:
    run_dir = out / dataset / name
    summary_file = run_dir / "train_summary.json"
    if not summary_file.is_file():
        cmd = [str(Path(sys.executable).parent / "dpr-train"), f"data={dataset}", f"data_dir={data_dir}",
               f"output_dir={run_dir}", "train.validate_at_start=true", "train.save_every=0", *overrides, *extra]
        print("+", " ".join(cmd), flush=True)
        started = time.time()
        proc = subprocess.run(cmd, env={**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled")})
        if proc.returncode != 0:
            return {"dataset": dataset, "variant": name, "error": f"exit {proc.returncode}",
                    "wall_s": round(time.time() - started, 1)}
    return row_of(dataset, name, json.loads(summary_file.read_text()))


def row_of(dataset: str, name: str, summary: dict) -> dict:
    best = summary.get("final_metrics", {})
    start = summary.get("initial_validation") or {}
    row = {"dataset": dataset, "variant": name, "steps": summary.get("steps"), "best_step": summary.get("best_step"),
           "wall_s": summary.get("wall_time_s"), "precision": summary.get("precision")}
    for m in METRICS:
        if f"val_{m}" in best:
            row[m] = best[f"val_{m}"]
            row[f"{m}_ci95"] = best.get(f"val_{m}_ci95")
        if m in start:
            row[f"{m}_start"] = start[m]
    return row


def table(rows: list[dict]) -> str:
    head = ("| dataset | variant | dev top-1 | dev top-5 | dev top-20 | dev MRR | avg rank | dev nDCG@10 "
            "| best step / steps | wall s |")
    lines = [head, "|" + "---|" * 10]

    def cell(r, m, pct=True):
        if m not in r:
            return ""
        v, ci = r[m], r.get(f"{m}_ci95")
        scale, fmt = (100, ".1f") if pct else (1, ".3f" if m.startswith("ndcg") else ".1f")
        return f"{v * scale:{fmt}} ± {ci * scale:{fmt}}" if ci is not None else f"{v * scale:{fmt}}"

    seen = set()
    for r in rows:
        if r["dataset"] not in seen and "top1_start" in r:  # the untrained starting point, once per dataset
            seen.add(r["dataset"])
            start = {m: r[f"{m}_start"] for m in METRICS if f"{m}_start" in r}
            lines.append(f"| {r['dataset']} | (untrained) | {cell(start, 'top1')} | {cell(start, 'top5')} "
                         f"| {cell(start, 'top20')} | {cell(start, 'mrr')} | {cell(start, 'avg_rank', pct=False)} "
                         f"| {cell(start, 'ndcg@10', pct=False)} | | |")
        if "error" in r:
            lines.append(f"| {r['dataset']} | {r['variant']} | {r['error']} ||||||||")
            continue
        lines.append(f"| {r['dataset']} | {r['variant']} | {cell(r, 'top1')} | {cell(r, 'top5')} | {cell(r, 'top20')} "
                     f"| {cell(r, 'mrr')} | {cell(r, 'avg_rank', pct=False)} | {cell(r, 'ndcg@10', pct=False)} "
                     f"| {r['best_step']} / {r['steps']} "
                     f"| {r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="squad1_open,sciq_open,nfcorpus")
    ap.add_argument("--variants", default="all", help="comma list of " + ", ".join(VARIANTS) + ", or all")
    ap.add_argument("--out", default="runs/ablation", type=owned_dir(MARKER, "ablation.json"),
                    help="the runs and the tables (new, empty, or an earlier ablation's)")
    ap.add_argument("--data-dir", default="data/prepared")
    ap.add_argument("--extra", nargs="*", default=[], help="overrides added to every run")
    ap.add_argument("--collect", action="store_true", help="only tabulate the runs already finished under --out")
    args = ap.parse_args(argv)
    names = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    out = Path(args.out)
    if not args.collect:
        claim_dir(out, MARKER, "ablate_training.py")
    rows = []
    for dataset in args.datasets.split(","):
        for name in names:
            if name in QRELS_ONLY and dataset != "nfcorpus":
                continue
            summary = out / dataset / name / "train_summary.json"
            if args.collect:
                if summary.is_file():
                    rows.append(row_of(dataset, name, json.loads(summary.read_text())))
                continue
            rows.append(run_variant(dataset, name, VARIANTS[name][1], out, args.data_dir, args.extra))
            write(out, rows)
    print(table(rows))


def write(out: Path, rows: list[dict]) -> None:
    sys.path.insert(0, str(REPO))
    from dpr.atomic import write_json_atomic, write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    legend = "\n".join(f"- `{n}`: {d} (`{' '.join(o) or 'defaults'}`)" for n, (d, o) in VARIANTS.items())
    write_text_atomic(out / "ablation.md", "# Training ablation (dev split; ± = 95% interval)\n\n" + table(rows)
                      + "\n" + legend + "\n")
    write_json_atomic(out / "ablation.json", {"rows": rows, "variants": {n: o for n, (_, o) in VARIANTS.items()}})
    buf = io.StringIO()
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("dataset", "variant"), k))
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
    write_text_atomic(out / "ablation.csv", buf.getvalue())


if __name__ == "__main__":
    main()
