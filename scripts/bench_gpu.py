#!/usr/bin/env python
"""Ours against sentence-transformers on the same card: training, encoding, cross-encoder scoring and training.

Each stage is one of the CPU benches run with ``--device`` (nothing copied: their rows, MFU and ratios are the
ones `dpr.perf.report` defines), in its own process, while this process samples the GPU's utilisation
(``nvidia-smi --query-gpu=utilization.gpu``, else ``torch.cuda.utilization``) every ``--sample-s`` seconds:

- ``train``: `scripts/bench_train.py` — MultipleNegativesRankingLoss against our two-tower step at DPR's batch
  (``--batch-size 128``, 1 hard negative), fp32 and bf16 (both sides under the same autocast);
- ``encode``: `scripts/bench_encode.py` — ``SentenceTransformer.encode`` against our ``encode_texts``;
- ``rerank``: `scripts/bench_rerank.py` — ``CrossEncoder.predict`` and ``CrossEncoderTrainer`` against our
  scoring and training step.

Writes one JSON (``--json``: per stage the bench's own report, its seconds and the utilisation samples'
mean / p50 / max; ``train_examples_per_s`` and ``encode_passages_per_s`` as ``{"ours": x, "peer": y}`` in the
best precision both sides ran) and one markdown table (``--md``). MFU is each bench's: `dpr.perf.flops` over the
matmul peak measured on the device (`dpr.perf.peak`).

    python scripts/bench_gpu.py --json runs/gpu_check/bench_gpu.json --md runs/gpu_check/bench_gpu.md
    python scripts/bench_gpu.py --device cpu --model <tiny bert dir> --steps 3 ...   # the CPU rehearsal (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from script_args import OneLineParser, comma_list, json_output, output_file, real, whole  # scripts/ is on sys.path

REPO = Path(__file__).resolve().parents[1]
PEER = "sentence-transformers"


class UtilSampler:
    """GPU utilisation (%) sampled in a thread while a stage runs; no samples on the CPU."""

    def __init__(self, device: str, every_s: float = 0.5) -> None:
        self.every_s, self.samples, self.source = every_s, [], None
        self._stop = threading.Event()
        self._read = None
        if device.startswith("cuda"):
            index = device.partition(":")[2] or "0"
            if shutil.which("nvidia-smi"):
                self.source = "nvidia-smi"
                self._read = lambda: float(subprocess.run(
                    ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", index],
                    capture_output=True, text=True, timeout=10, check=True).stdout.split()[0])
            else:
                import torch

                self.source = "torch.cuda.utilization"
                self._read = lambda: float(torch.cuda.utilization(int(index)))
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.samples.append(self._read())
            except Exception:  # noqa: BLE001 - a missed sample is not a failed stage
                continue

    def __enter__(self) -> "UtilSampler":
        if self._read is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        s = sorted(self.samples)
        return {"mean": round(statistics.fmean(s), 1), "p50": s[len(s) // 2], "max": s[-1], "samples": len(s),
                "source": self.source}


def run_stage(name: str, argv: list[str], out_dir: Path, device: str, sample_s: float) -> dict:
    """Run one bench script with ``--json``; its report, seconds and utilisation."""
    report_path = out_dir / f"bench_gpu_{name}.json"
    log_path = out_dir / f"bench_gpu_{name}.log"
    cmd = [sys.executable, str(REPO / "scripts" / argv[0]), *argv[1:], "--device", device, "--json", str(report_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    with UtilSampler(device, sample_s) as sampler, open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    seconds = round(time.perf_counter() - t0, 1)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
        return {"ok": False, "seconds": seconds, "log": str(log_path), "error_tail": tail,
                "gpu_util": sampler.summary()}
    return {"ok": True, "seconds": seconds, "log": str(log_path), "report": json.loads(report_path.read_text()),
            "gpu_util": sampler.summary()}


def ours_vs_peer(report: dict | None) -> dict:
    """``{"ours": x, "peer": y, "precision": p}``: the ``ours`` and peer rows in bf16 where both ran, else fp32."""
    if not report:
        return {"ours": None, "peer": None, "precision": None}
    rate = {(r["system"], r["precision"]): r["per_s"] for r in report.get("rows", [])}
    for p in ("bf16", "fp32"):
        if ("ours", p) in rate and (PEER, p) in rate:
            return {"ours": rate[("ours", p)], "peer": rate[(PEER, p)], "precision": p}
    return {"ours": None, "peer": None, "precision": None}


def markdown(result: dict) -> str:
    """One table: every stage's rows (system, precision, rate, MFU) with the stage's GPU utilisation."""
    lines = [f"GPU benchmark on {result['device_name']} ({result['device']}), ours against {PEER}.", "",
             "| stage | system | precision | per s | MFU | GPU util mean / max % | stage s |",
             "|---|---|---|---:|---:|---:|---:|"]
    for stage, res in result["stages"].items():
        util = res.get("gpu_util")
        util_s = f"{util['mean']} / {util['max']}" if util else "n/a"
        if not res["ok"]:
            lines.append(f"| {stage} | FAILED (log: {res['log']}) | | | | {util_s} | {res['seconds']} |")
            continue
        parts = [(k, v) for k, v in res["report"].items() if isinstance(v, dict) and "rows" in v] or [("", res["report"])]
        for part, rep in parts:
            for r in rep["rows"]:
                mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else ""
                name = f"{stage} {part}".strip()
                lines.append(f"| {name} | {r['system']} | {r['precision']} | {r['per_s']:.1f} | {mfu} | {util_s} | "
                             f"{res['seconds']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (a rehearsal: no utilisation)")
    ap.add_argument("--model", default="all-MiniLM-L6-v2", help="alias or HF model dir (both sides)")
    ap.add_argument("--data-dir", type=Path, default=REPO / "data" / "prepared")
    ap.add_argument("--data", default="squad1_open")
    ap.add_argument("--steps", type=whole(2), default=20, help="training steps per row (train and rerank)")
    ap.add_argument("--batch-size", type=whole(1), default=128, help="training batch (DPR's: 128 questions)")
    ap.add_argument("--hard-negatives", type=whole(0), default=1)
    ap.add_argument("--encode-n", type=whole(1), default=20000, help="passages encoded per round")
    ap.add_argument("--encode-batch-size", type=whole(1), default=512)
    ap.add_argument("--rerank-pairs", type=whole(1), default=4000)
    ap.add_argument("--rerank-batch-size", type=whole(1), default=32, help="cross-encoder training batch (questions)")
    ap.add_argument("--stages", type=comma_list(), default=["train", "encode", "rerank"],
                    help="comma list of train, encode, rerank (default: all three)")
    ap.add_argument("--quick", action="store_true", help="fp32 rows only and a small matmul peak (the CPU rehearsal)")
    ap.add_argument("--sample-s", type=real(0, lo_open=True), default=0.5, help="utilisation sampling period")
    ap.add_argument("--out-dir", type=Path, default=None, help="the stages' reports and logs (default: beside --json)")
    ap.add_argument("--json", type=json_output, required=True)
    ap.add_argument("--md", type=output_file, default=None)
    args = ap.parse_args(argv)

    import torch

    on_gpu = args.device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        ap.error(f"argument --device: {args.device}, but torch sees no CUDA GPU")
    out_dir = args.out_dir or args.json.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    data = ["--model", args.model, "--data-dir", str(args.data_dir)]
    stages = {
        "train": ["bench_train.py", *data, "--data", args.data, "--steps", str(args.steps),
                  "--batch-size", str(args.batch_size), "--hard-negatives", str(args.hard_negatives)],
        "encode": ["bench_encode.py", *data, "--dataset", args.data, "--n", str(args.encode_n),
                   "--batch-size", str(args.encode_batch_size), "--repeat", "2", "--no-int8", "--no-onnx",
                   "--no-compile", "--no-corpus"],
        "rerank": ["bench_rerank.py", *data, "--data", args.data, "--pairs", str(args.rerank_pairs),
                   "--steps", str(max(2, args.steps // 2)), "--train-batch-size", str(args.rerank_batch_size),
                   "--repeats", "3"],
    }
    if args.quick:
        quick = ["--peak-n", "256"]
        stages["train"] += [*quick, "--no-bf16"]
        stages["encode"] += [*quick, "--no-bf16"]
        stages["rerank"] += [*quick, "--precision", "fp32", "--repeats", "1"]
    wanted = args.stages
    unknown = sorted(set(wanted) - set(stages))
    if unknown:
        ap.error(f"argument --stages: unknown stage(s) {unknown}; known: {sorted(stages)}")
    result = {"device": args.device, "device_name": torch.cuda.get_device_name(torch.device(args.device))
              if on_gpu else "CPU", "model": args.model, "batch_size": args.batch_size,
              "hard_negatives": args.hard_negatives, "stages": {}}
    for name in wanted:
        print(f"bench_gpu: {name} ...", flush=True)
        result["stages"][name] = res = run_stage(name, stages[name], out_dir, args.device, args.sample_s)
        print(f"bench_gpu: {name} {'ok' if res['ok'] else 'FAILED'} in {res['seconds']} s; "
              f"GPU util {res['gpu_util']}", flush=True)
    train, encode = result["stages"].get("train", {}), result["stages"].get("encode", {})
    result["train_examples_per_s"] = ours_vs_peer(train.get("report"))
    result["encode_passages_per_s"] = ours_vs_peer(encode.get("report"))
    result["gpu_util"] = {name: res.get("gpu_util") for name, res in result["stages"].items()}
    result["ok"] = all(res["ok"] for res in result["stages"].values())
    from dpr.atomic import write_json_atomic, write_text_atomic

    write_json_atomic(args.json, result, indent=1)
    table = markdown(result)
    if args.md:
        write_text_atomic(args.md, table)
    print(table)
    if not result["ok"]:
        failed = [n for n, r in result["stages"].items() if not r["ok"]]
        raise SystemExit(f"bench_gpu: stage(s) {failed} failed (logs in {out_dir})")
    return result


if __name__ == "__main__":
    main()
