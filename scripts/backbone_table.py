#!/usr/bin/env python
"""The tables of docs/backbones.md "Measurements" from finished `dpr-pipeline` runs on squad1_open.

    .venv/bin/python scripts/backbone_table.py lora full=runs/squad1_open lora16=runs/lora16_lr5e-4 ...
    .venv/bin/python scripts/backbone_table.py dims default=runs/squad1_open mrl=runs/mrl --dims 192,96,48

``lora``: per run, the dev figures of the weights the trainer kept (its train_summary.json: 649 dev questions,
the trainer's dev pool), the trainable parameters (counted from the saved towers: every weight of a fully
fine-tuned tower, the adapters of a LoRA one), the size of the trained model directory (its towers, and with the
checkpoints the trainer keeps for resuming) and the training loop's seconds (train_summary.json). ``dims``: dev top-k over the whole
corpus of `dense` and each `dense@<d>` (the runs' dev.json retrieval, has_answer), side by side per run. Test
figures are in the runs' report.json (docs/results/reports/, written into the page by results_tables.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from safetensors import safe_open
from script_args import OneLineParser, comma_list, whole  # scripts/ is on sys.path

TOWERS = ("question_encoder", "passage_encoder")


def _elements(path: Path) -> int:
    with safe_open(str(path), framework="pt") as f:
        total = 0
        for key in f.keys():
            n = 1
            for s in f.get_slice(key).get_shape():
                n *= int(s)
            total += n
        return total


def trainable_parameters(model_dir: Path) -> int:
    """Weights the run trained: a LoRA tower's adapters (adapter_model.safetensors), else the whole tower."""
    total = 0
    for tower in TOWERS:
        d = model_dir / tower
        adapter = d / "adapter_model.safetensors"
        total += _elements(adapter if adapter.is_file() else d / "model.safetensors")
    return total


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def lora_row(name: str, run: Path) -> str:
    model = run / "model"
    summary = json.loads((model / "train_summary.json").read_text())
    m = summary["final_metrics"]
    towers = sum(size_mb(model / t) for t in TOWERS)
    figures = " | ".join(f"{100 * m[f'val_{k}']:.1f} ± {100 * m[f'val_{k}_ci95']:.1f}" for k in ("top1", "top5", "top20"))
    return (f"| {name} | {figures} | {100 * m['val_mrr']:.1f} | {trainable_parameters(model) / 1e6:.2f} M | "
            f"{towers:.1f} MB | {size_mb(model):.1f} MB | {summary['train_seconds']:.0f} |")


def dev_topk(results: Path, ks=(1, 5, 20, 100)) -> list[float]:
    from dpr.eval.topk import first_hit_ranks, top_k_accuracy

    ranks = first_hit_ranks(json.loads(results.read_text()), desc=results.parent.name)
    acc = top_k_accuracy(ranks, ks)
    return [100 * acc[k] for k in ks]


def _run(text: str) -> tuple[str, Path]:
    """``NAME=RUN_DIR``: a label and an existing run directory."""
    name, eq, run = text.partition("=")
    if not eq or not name or not Path(run).is_dir():
        raise argparse.ArgumentTypeError(f"expected NAME=RUN_DIR with RUN_DIR a directory, got {text!r}")
    return name, Path(run)


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table", choices=("lora", "dims"))
    ap.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR", type=_run)
    ap.add_argument("--dims", type=comma_list(whole(1)), default=[192, 96, 48])
    args = ap.parse_args(argv)
    runs = args.runs
    if args.table == "lora":
        print("| run | dev top-1 | dev top-5 | dev top-20 | dev MRR | trainable | towers | model dir (+ checkpoints) "
              "| train loop s |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, run in runs:
            print(lora_row(name, run))
        return
    print("| size | " + " | ".join(f"{n} dev top-1 / 5 / 20 / 100" for n, _ in runs) + " |")
    print("|---|" + "---|" * len(runs))
    for system in ["dense", *(f"dense@{d}" for d in args.dims)]:
        cells = [" / ".join(f"{v:.1f}" for v in dev_topk(run / system / "dev.json")) for _, run in runs]
        print(f"| {system} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
