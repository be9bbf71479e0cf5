#!/usr/bin/env python
"""Peak memory of `dpr.encode.encode_corpus` (dpr-encode, the pipeline's dense encode) against corpus size, for
this checkout and a peer checkout (an earlier commit's worktree) measured in the same run.

    git worktree add -f /tmp/peer <commit> && ln -s "$PWD/.venv" /tmp/peer/.venv
    nice .venv/bin/python scripts/bench_encode_memory.py --passages a_200k.tsv b_1m.tsv \
        --peer /tmp/peer --json runs/encode_memory.json [--num-shards 10 --shard-id 0]

For every corpus and checkout, a fresh process first builds the passages' Arrow copy (`load_passages`, from an
empty cache directory of the checkout's own; its peaks are recorded as ``build``), then another fresh process runs ``encode_corpus`` with the tiny random model of the
scale scripts (`scale_synth.tiny_model`: 2 layers, 32 dims) and the default `EncodeConfig`, while a thread samples
``/proc/self/status`` every 20 ms. Recorded per run: the peaks of VmRSS (all resident memory), RssAnon (heap,
tensors) and RssFile (pages of memory-mapped files: the Arrow copy, the vector shard) during the call, their values
just before it (torch and transformers imported, nothing of the corpus yet), wall and CPU seconds, and the sha256 of every output file
(the manifest without its timing fields), so ``identical`` says whether both checkouts wrote the same bytes.

Growth law per checkout: the least-squares slope b of each peak against the passages encoded
(`scale_stats.project`), carried to ``--target`` (default 5M); ``ratio``: this checkout's peak over the peer's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
KEYS = ("VmRSS", "RssAnon", "RssFile")
TIMING = ("seconds", "passages_per_second")  # manifest fields that differ run to run


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def digests(out: Path) -> dict[str, str]:
    """sha256 of every file in ``out``; a manifest's without its timing fields."""
    found = {}
    for p in sorted(out.iterdir()):
        data = p.read_bytes()
        if p.suffix == ".json":
            manifest = {k: v for k, v in json.loads(data).items() if k not in TIMING}
            data = json.dumps(manifest, sort_keys=True).encode()
        found[p.name] = hashlib.sha256(data).hexdigest()
    return found


def run_child(args: argparse.Namespace) -> None:
    """One measurement (or, with ``--prepare``, the Arrow copy's build) in this process, with ``--repo``'s dpr."""
    sys.path.insert(0, str(args.repo))
    from scale_stats import StatusPeaks, status_bytes

    passages = args.passages[0]
    from dpr.data.passages import load_passages
    from dpr.encode import encode_corpus
    from dpr.encode_config import EncodeConfig

    if args.prepare:  # the Arrow copy's build (from_generator over iter_passages), from an empty cache
        before = status_bytes(KEYS)
        c0 = _cpu_s()
        with StatusPeaks(KEYS) as peaks:
            n = len(load_passages(passages, cache_dir=args.cache))
        print(json.dumps({"passages": n, "before": before, "peak": peaks.peak, "cpu_s": round(_cpu_s() - c0, 1)}))
        return
    import torch  # noqa: F401 - the fixed cost of the libraries is in ``before``, not in the growth
    import transformers  # noqa: F401

    before = status_bytes(KEYS)
    c0, t0 = _cpu_s(), time.perf_counter()
    with StatusPeaks(KEYS) as peaks:
        encode_corpus(args.model, passages, args.out, EncodeConfig(), num_shards=args.num_shards,
                      shard_id=args.shard_id, cache_dir=args.cache, progress=False)
    result = {"before": before, "peak": peaks.peak, "wall_s": round(time.perf_counter() - t0, 1),
              "cpu_s": round(_cpu_s() - c0, 1), "files": digests(args.out)}
    print(json.dumps(result))


def _child(args: argparse.Namespace, repo: Path, passages: Path, cache: Path, out: Path, prepare: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", "--repo", str(repo), "--model", str(args.model),
           "--passages", str(passages), "--cache", str(cache), "--out", str(out),
           "--num-shards", str(args.num_shards), "--shard-id", str(args.shard_id)] + (["--prepare"] if prepare else [])
    done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench_encode_memory: {repo} on {passages} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, label: str, repo: Path, passages: Path) -> dict:
    """Build the Arrow copy, then encode, each in a fresh process; the encode's figures."""
    cache = args.work / f"cache_{label}"
    out = args.work / f"out_{label}_{passages.stem}"
    for old in (out, cache):  # a fresh encode, from a fresh Arrow copy
        if old.exists():
            shutil.rmtree(old)
    build = _child(args, repo, passages, cache, out, prepare=True)
    total = build.pop("passages")
    if args.build_only:
        print(f"{label} {passages.name}: Arrow copy of {total} passages; peak GiB "
              f"{ {k: round(v / 2 ** 30, 3) for k, v in build['peak'].items()} }", flush=True)
        return {"passages": total, "encoded": total, "build": build, "peak": build["peak"], "files": {}}
    result = _child(args, repo, passages, cache, out, prepare=False)
    result["build"] = build
    a = args.shard_id * total // args.num_shards
    b = (args.shard_id + 1) * total // args.num_shards
    result.update(passages=total, encoded=b - a)
    gib = {k: round(v / 2 ** 30, 3) for k, v in result["peak"].items()}
    print(f"{label} {passages.name}: {total} passages, {b - a} encoded; peak GiB {gib}; "
          f"{result['cpu_s']} CPU s", flush=True)
    return result


def summarise(runs: dict, target: int) -> dict:
    """Growth law of each peak per checkout, and this checkout's peaks over the peer's at each size."""
    from scale_stats import project

    laws: dict = {}
    for label, per in runs.items():
        sizes = [r["encoded"] for r in per.values()]
        laws[label] = {k: project(sizes, [r["peak"][k] for r in per.values()], target) for k in KEYS}
    ratio = {}
    if "peer" in runs:
        for name, r in runs["this"].items():
            peer = runs["peer"][name]
            ratio[name] = {k: round(r["peak"][k] / peer["peak"][k], 3) if peer["peak"][k] else None for k in KEYS}
            if r["files"]:  # an encode (not --build-only): the same output bytes?
                ratio[name]["identical"] = r["files"] == peer["files"]
    return {"laws": laws, "ratio": ratio}


def main(argv: list[str] | None = None) -> None:
    for where in (REPO, HERE):  # script_args, scale_synth, scale_stats; this checkout's dpr for the tiny model
        if str(where) not in sys.path:
            sys.path.insert(0, str(where))
    from script_args import OneLineParser, json_output, whole

    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=Path, nargs="+", required=True, help="passages.tsv files, smallest first")
    ap.add_argument("--peer", type=Path, help="another checkout to measure alike (its .venv linked to ours)")
    ap.add_argument("--json", type=json_output)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_encode_memory"))
    ap.add_argument("--num-shards", type=whole(1), default=1)
    ap.add_argument("--shard-id", type=whole(0), default=0)
    ap.add_argument("--target", type=whole(1), default=5_000_000)
    ap.add_argument("--build-only", action="store_true", help="measure only the Arrow copy's build (peak = build)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return run_child(args)
    if args.shard_id >= args.num_shards:
        ap.error(f"argument --shard-id: must be below --num-shards ({args.num_shards}), got {args.shard_id}")
    for p in args.passages:
        if not p.is_file():
            ap.error(f"argument --passages: {p} is not a file")
    from scale_synth import tiny_model

    args.work.mkdir(parents=True, exist_ok=True)
    args.model = tiny_model(args.work / "tiny_model")
    checkouts = {"this": REPO, **({"peer": args.peer.resolve()} if args.peer else {})}
    runs = {label: {p.name: measure(args, label, repo, p.resolve()) for p in args.passages}
            for label, repo in checkouts.items()}
    commit = {label: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                                    text=True).stdout.strip() for label, repo in checkouts.items()}
    report = {"commit": commit, "num_shards": args.num_shards, "shard_id": args.shard_id, "runs": runs,
              **summarise(runs, args.target)}
    print(json.dumps({"laws": report["laws"], "ratio": report["ratio"]}, indent=1))
    if args.json:
        from dpr.atomic import write_json_atomic

        write_json_atomic(args.json, report)


if __name__ == "__main__":
    main()
