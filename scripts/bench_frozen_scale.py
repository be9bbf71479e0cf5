#!/usr/bin/env python
"""The frozen-index phase's per-process peak memory and step time against the corpus size, with and without
``train.corpus_sample``.

    nice .venv/bin/python scripts/bench_frozen_scale.py --sizes 200000,1000000 --sample 20000 \\
        --peer-sizes 200000 --json runs/frozen_scale.json

At each size N a synthetic dataset is written (`scale_synth.PassageSampler` over a seed vocabulary: N passages;
``--questions`` training questions whose positives and one mined negative are among them, each answer a word of its
positive passage alone, as a real answer is rare in a corpus) and one training run
(a tiny random 2-layer BERT, ``--frozen-steps`` frozen-index steps, no two-tower steps, no validation) runs in a
fresh process: its peak RSS (``ru_maxrss``), its wall time, and the frozen steps' mean time (metrics.jsonl). The
peer is the same run without ``corpus_sample`` (the whole corpus cached), at ``--peer-sizes``. The growth law of
each is the log-log slope over the sizes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_synth import tiny_model  # noqa: E402

SEED_TEXT = ("the of and in to a was is for on as by with he that at from his it an were are which this also be has "
             "had first one their its new after but who not they have her she two been other when there all during "
             "into school time may years more most only over city some world would where later up such used many can "
             "state about national out known university united then made team american between called river war")


def write_dataset(root: Path, n: int, questions: int, seed: int) -> None:
    """``passages.tsv`` (n synthetic passages) and ``train.json`` (questions on the first ``2 x questions``)."""
    import numpy as np
    from scale_synth import PassageSampler

    from dpr.data.retriever_json import write_retriever_json

    root.mkdir(parents=True, exist_ok=True)
    words = SEED_TEXT.split()
    rng = np.random.default_rng(seed)
    seed_texts = [" ".join(rng.choice(words, size=int(rng.integers(60, 120)))) for _ in range(200)]
    sampler = PassageSampler(seed_texts, [f"Title {i}" for i in range(500)], seed=seed)
    kept: list[tuple[str, str]] = []
    with open(root / "passages.tsv", "w", encoding="utf-8") as f:
        f.write("id\ttext\ttitle\n")
        for start in range(0, n, 50_000):
            texts, titles = sampler.sample(min(50_000, n - start))
            for i, (text, title) in enumerate(zip(texts, titles)):
                j = start + i
                if j < 2 * questions and j % 2 == 0:  # a question's answer: a word in its positive passage alone
                    text = f"{text} answer{j // 2}x"
                f.write(f"s{j}\t{text}\t{title}\n")
                if start + i < 2 * questions:
                    kept.append((text, title))

    def ctx(j: int) -> dict:
        return {"passage_id": f"s{j}", "title": kept[j][1], "text": kept[j][0]}

    write_retriever_json(root / "train.json", (
        {"question": " ".join(kept[2 * q][0].split()[:8]), "answers": [f"answer{q}x"],
         "positive_ctxs": [ctx(2 * q)], "hard_negative_ctxs": [ctx(2 * q + 1)], "negative_ctxs": []}
        for q in range(questions)))
    (root / "meta.json").write_text(json.dumps({"name": root.name, "kind": "qa"}), encoding="utf-8")


def child(args: argparse.Namespace) -> None:
    """One training run in this process; prints one JSON line with its peak RSS and times."""
    from dpr.training.train import train
    from dpr.trainkit.metrics_log import read_jsonl

    train_cfg = {"batch_size": args.batch_size, "hard_negatives": 1, "frozen_steps": args.frozen_steps,
                 "max_steps": 0, "epochs": 0, "validate": False, "save_every": 0, "precision": "fp32",
                 "print_every": 1000, "val_batch_size": 256, "cpu_threads": args.threads}
    if args.sample:
        train_cfg["corpus_sample"] = args.sample
    start = time.perf_counter()
    train({"model": {"name": str(args.model), "pooling": "mean", "question_max_length": 32,
                     "passage_max_length": 64},
           "data": {"name": args.data.name, "kind": "qa"}, "train": train_cfg, "logger": {"type": "none"},
           "data_dir": str(args.data.parent), "output_dir": str(args.out), "seed": 7})
    wall = time.perf_counter() - start
    rows = [r for r in read_jsonl(args.out / "metrics.jsonl") if "examples_per_s" in r]
    step_s = [args.batch_size / r["examples_per_s"] for r in rows[1:]]  # the first step pays for the start
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "wall_s": wall,
                      "frozen_step_s": sum(step_s) / max(1, len(step_s))}))


def slope(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="200000,1000000")
    ap.add_argument("--peer-sizes", default="200000", help="sizes also run without corpus_sample ('' for none)")
    ap.add_argument("--sample", type=int, default=20_000)
    ap.add_argument("--questions", type=int, default=2_000)
    ap.add_argument("--frozen-steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_frozen_scale"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    model = tiny_model(args.work / "tiny_bert")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    peers = {int(s) for s in args.peer_sizes.split(",") if s}
    results = []
    for n in sizes:
        data = args.work / f"synth{n}"
        if not (data / "train.json").is_file():
            write_dataset(data, n, args.questions, seed=0)
        for sample in ([args.sample] + ([0] if n in peers else [])):
            out = args.work / f"run{n}_{sample}"
            cmd = [sys.executable, __file__, "--child", "--model", str(model), "--data", str(data), "--out", str(out),
                   "--sample", str(sample), "--frozen-steps", str(args.frozen_steps), "--batch-size",
                   str(args.batch_size), "--threads", str(args.threads)]
            line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            row = {"passages": n, "corpus_sample": sample or None, **json.loads(line)}
            print(json.dumps(row), flush=True)
            results.append(row)
    laws = {}
    for label, pick in (("sampled", lambda r: r["corpus_sample"]), ("whole corpus", lambda r: not r["corpus_sample"])):
        rows = [r for r in results if pick(r)]
        laws[label] = {k: slope([r["passages"] for r in rows], [r[k] for r in rows])
                       for k in ("peak_rss_mb", "frozen_step_s", "wall_s")}
    report = {"runs": results, "log_log_slopes": laws, "sample": args.sample, "questions": args.questions,
              "frozen_steps": args.frozen_steps, "batch_size": args.batch_size, "threads": args.threads}
    print(json.dumps(laws, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
