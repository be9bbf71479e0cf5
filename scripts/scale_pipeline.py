#!/usr/bin/env python
"""The whole `dpr-pipeline` on synthetic corpora: wall time, CPU time and peak RSS of every stage, their growth
laws, and the projection to 21M passages.

    nice -n 10 .venv/bin/python scripts/scale_pipeline.py --sizes 200000,1000000 --json runs/scale_pipeline.json

At each size N the corpus is squad1_open's real passages hidden at seeded random rows among N - 3,526 synthetic
ones (`scale_synth.PassageSampler`: the real length and word distributions, real titles); the questions, training
and dev files are squad1_open's own, so every stage reads the files a real run would. The model is a tiny random
BERT (2 layers, 32 dims, MiniLM's tokenizer): the costs that grow with N (reading, tokenising, indexing, searching
the corpus) are the pipeline's, not a large model's. Each size runs in a fresh process (`--one`) with the
pipeline's default config (``train=pipeline``, frozen phase on); each stage records:

- ``wall_s``: its wall time; ``cpu_s``: user + system CPU time of the process and its children over it;
- ``peak_rss_bytes``: the process's highest total RSS while it ran (VmRSS: heap plus the memory-mapped Arrow,
  shard and index pages it touched), ``peak_anon_bytes`` the anonymous part (RssAnon), sampled every 20 ms;
  ``rss_before_bytes``: VmRSS when it started (what earlier stages left: the peak is the process's, not the
  stage's alone).

Stages whose cost does not depend on N (model save, prepare) are reported as fixed. Growth law: the least-squares
slope b of log cost against log N over the sizes (cost ∝ N^b); projection: the largest size's cost × (21M/N)^b.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_stats import StatusPeaks, growth_table, status_bytes  # noqa: E402
from scale_synth import tiny_model  # noqa: E402

log = logging.getLogger("scale_pipeline")


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def instrument(stats: dict, on_stage=lambda: None) -> None:
    """Wrap `StageRunner.run` so that every stage that runs records its wall, CPU and peak memory in ``stats``
    (``on_stage`` is called after each: the figures so far reach disk, so a run stopped midway keeps them)."""
    from dpr.stages import StageRunner

    real_run = StageRunner.run

    def run(self, name, fn, **kw):  # type: ignore[no-untyped-def]
        box: dict = {}

        def measured():
            c0, t0, before = _cpu_s(), time.perf_counter(), status_bytes(("VmRSS",))["VmRSS"]
            with StatusPeaks(("VmRSS", "RssAnon")) as peak:
                fn()
            box.update(wall_s=time.perf_counter() - t0, cpu_s=_cpu_s() - c0, peak_rss_bytes=peak.peak["VmRSS"],
                       peak_anon_bytes=peak.peak["RssAnon"], rss_before_bytes=before)

        ran = real_run(self, name, measured, **kw)
        if ran:
            stats[name] = box
            log.info("[%s] %s", name, {k: round(v, 1) if isinstance(v, float) else v for k, v in box.items()})
            on_stage()
        return ran

    StageRunner.run = run


def synth_dataset(real_root: Path, out: Path, n: int, seed: int) -> Path:
    """``out`` = ``real_root``'s files with its passages hidden among ``n`` - R synthetic ones."""
    from dpr.data.passages import iter_passages
    from scale_synth import PassageSampler, mix_order

    if (out / "passages.tsv").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for p in real_root.iterdir():
        if p.is_file() and p.name != "passages.tsv":
            shutil.copy2(p, out / p.name)
    rows = list(iter_passages(real_root / "passages.tsv"))
    r = len(rows)
    sampler = PassageSampler([x["text"] for x in rows], sorted({x["title"] for x in rows}), seed)
    order = mix_order(n, seed + n)
    tmp = out / ".passages.tsv.tmp"
    batch = 200_000
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("id\ttext\ttitle\n")
        synth: dict[int, tuple[str, str]] = {}
        for start in range(0, n, batch):  # synthetic rows drawn in batches: memory stays at one batch of text
            idx = order[start:start + batch]
            need = sorted(int(j) - r for j in idx if j >= r)
            texts, titles = sampler.sample(len(need))
            synth = {j: (t, ti) for j, t, ti in zip(need, texts, titles)}
            for j in idx.tolist():
                if j < r:
                    f.write(f"{rows[j]['id']}\t{rows[j]['text']}\t{rows[j]['title']}\n")
                else:
                    t, ti = synth[j - r]
                    f.write(f"syn{j - r}\t{t}\t{ti}\n")
    tmp.rename(out / "passages.tsv")
    return out


def run_one(args: argparse.Namespace) -> None:
    """One size in this process: the pipeline with every stage measured; the figures to ``--json``."""
    from hydra import compose, initialize_config_dir

    import dpr.cli.pipeline  # noqa: F401 - registers the pipeline's config groups
    from dpr.atomic import write_json_atomic
    from dpr.cli.common import CONF_DIR
    from dpr.pipeline import run_pipeline

    stats: dict = {}
    overrides = [f"data.name={args.dataset_name}", "data.kind=qa", "data.recipe=none", f"data_dir={args.data_dir}",
                 f"output_dir={args.output_dir}", f"model.name={args.model}", *args.override]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("pipeline", overrides=overrides)
    instrument(stats, lambda: write_json_atomic(args.json, {"stages": stats, "overrides": overrides, "complete": False}))
    c0, t0 = _cpu_s(), time.perf_counter()
    with StatusPeaks(("VmRSS", "RssAnon")) as peak:
        run_pipeline(cfg)
    total = {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu_s() - c0, "peak_rss_bytes": peak.peak["VmRSS"],
             "peak_anon_bytes": peak.peak["RssAnon"]}
    write_json_atomic(args.json, {"stages": stats, "total": total, "overrides": overrides})


FIXED = ("untrained_model",)  # no corpus in them: reported as fixed costs


def summarise(sizes: list[int], per_size: dict, target: int) -> dict:
    stages = sorted({s for r in per_size.values() for s in r["stages"]})
    laws = {}
    for stage in stages:
        series = {k: [per_size[str(n)]["stages"].get(stage, {}).get(k) for n in sizes]
                  for k in ("wall_s", "cpu_s", "peak_rss_bytes")}
        if stage in FIXED or len(sizes) < 2 or any(v is None for vals in series.values() for v in vals):
            laws[stage] = {"fixed": stage in FIXED}
            continue
        laws[stage] = growth_table(sizes, series, target)
    return laws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="200000,1000000")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--real", type=Path, default=REPO / "data" / "prepared" / "squad1_open",
                    help="a prepared dataset whose passages are kept among the synthetic ones")
    ap.add_argument("--work", type=Path, help="where the corpora and runs go (default: a temp dir, removed)")
    ap.add_argument("--target", type=int, default=21_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--override", action="append", default=[], help="a pipeline override (repeatable)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--dataset-name", help=argparse.SUPPRESS)
    ap.add_argument("--output-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.one:
        return run_one(args)
    from dpr.atomic import write_json_atomic

    if not (args.real / "passages.tsv").is_file():
        raise SystemExit(f"scale_pipeline: {args.real}/passages.tsv not found (prepare it: dpr-data data=squad1_open)")
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    work = args.work or Path(tempfile.mkdtemp(prefix="scale_pipeline_"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    results: dict = {"sizes": {}, "commit": commit, "target": args.target}
    try:
        model = tiny_model(work / "tiny_model")
        for n in sizes:
            name = f"synth{n}"
            synth_dataset(args.real, work / "data" / name, n, args.seed)
            part = work / f"stats_{n}.json"
            cmd = [sys.executable, __file__, "--one", "--json", str(part), "--data-dir", str(work / "data"),
                   "--dataset-name", name, "--output-dir", str(work / "runs" / name), "--model", str(model),
                   *[x for o in args.override for x in ("--override", o)]]
            log.info("size %d: %s", n, " ".join(cmd))
            subprocess.run(cmd, check=True)
            results["sizes"][str(n)] = json.loads(part.read_text())
            write_json_atomic(args.json, {**results, "complete": False})
        results["growth"] = summarise(sizes, results["sizes"], args.target)
        write_json_atomic(args.json, {**results, "complete": True})
        print(table(results, sizes))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def table(results: dict, sizes: list[int]) -> str:
    lines = ["| stage | " + " | ".join(f"{n:,}: wall s / CPU s / peak RSS MiB" for n in sizes) + " | wall b | RSS b |",
             "|---|" + "---|" * (len(sizes) + 2)]
    stages = sorted({s for r in results["sizes"].values() for s in r["stages"]})
    for stage in stages:
        cells = []
        for n in sizes:
            m = results["sizes"][str(n)]["stages"].get(stage)
            cells.append("–" if m is None else f"{m['wall_s']:.1f} / {m['cpu_s']:.1f} / {m['peak_rss_bytes'] / 2**20:,.0f}")
        g = results.get("growth", {}).get(stage, {})
        wall_b = g.get("wall_s", {}).get("exponent", "fixed" if g.get("fixed") else "–")
        rss_b = g.get("peak_rss_bytes", {}).get("exponent", "fixed" if g.get("fixed") else "–")
        lines.append(f"| {stage} | " + " | ".join(cells) + f" | {wall_b} | {rss_b} |")
    for n in sizes:
        t = results["sizes"][str(n)]["total"]
        lines.append(f"\ntotal at {n:,}: {t['wall_s']:.0f} s wall, {t['cpu_s']:.0f} s CPU, "
                     f"peak RSS {t['peak_rss_bytes'] / 2**30:.2f} GiB")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
