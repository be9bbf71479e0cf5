#!/usr/bin/env python
"""The Python half of `scripts/gpu_check.sh`: device facts, the DDP check, the report comparison, the summary.

    python scripts/gpu_check_stages.py facts <out.json>
    torchrun --nproc_per_node=2 scripts/gpu_check_stages.py ddp <out.json> [--backend gloo|nccl] [--device cpu|cuda]
    python scripts/gpu_check_stages.py compare <report.json> <committed report.json> <out.json>
    python scripts/gpu_check_stages.py tiny-model <dir>           # the --cpu mode's tiny random BERT
    python scripts/gpu_check_stages.py tiny-data <data dir>       # the --cpu mode's tiny dataset (the tests')
    python scripts/gpu_check_stages.py summary <OUT>              # <OUT>/gpu_check.json from the stages' files
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _write(path: str | Path, obj: dict) -> None:
    sys.path.insert(0, str(REPO))
    from dpr.atomic import write_json_atomic

    write_json_atomic(path, obj, indent=1)


def facts(out: str) -> None:
    """What the machine offers: torch, CUDA, each GPU, faiss and its GPUs, the cores and threads."""
    import faiss
    import torch

    from dpr.index.gpu import gpu_count
    from dpr.perf.threads import thread_share

    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                         "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count})
    share = thread_share()
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
            "gpus": gpus, "bf16": bool(gpus) and torch.cuda.is_bf16_supported(),
            "nccl": bool(gpus) and torch.distributed.is_nccl_available(), "faiss": faiss.__version__,
            "faiss_gpus": gpu_count(), "index_gpu_search": ("faiss" if gpu_count() else "torch exact (flat)"
                                                            if gpus else "cpu"),
            "cores": share.cores, "torch_threads": share.threads, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "python": sys.version.split()[0]}
    _write(out, info)
    print(json.dumps(info))


def ddp(out: str, backend: str, device_kind: str) -> None:
    """Under torchrun: every rank on ``device_kind`` (all ranks share GPU 0 under gloo; one GPU per rank under
    nccl): all-reduce, the loss's gradient-carrying all-gather, and DDP steps whose gradients must agree."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from dpr import distributed as D

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        dev = torch.device("cuda", local if backend == "nccl" else 0)  # gloo: the ranks share one GPU
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    dist.init_process_group(backend=backend)
    assert D.is_distributed() and D.world_size() == world
    x = torch.full((4,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    assert torch.allclose(x, torch.full_like(x, world * (world + 1) / 2)), x
    t = torch.full((rank + 1, 4), float(rank), device=dev, requires_grad=True)
    g = D.all_gather_with_grad(t)
    g.sum().backward()
    assert g.shape[0] == sum(r + 1 for r in range(world)), g.shape
    assert torch.allclose(t.grad, torch.full_like(t, float(world))), t.grad
    torch.manual_seed(0)
    net = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(),
                                                      torch.nn.Linear(64, 1)).to(dev),
                                  device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.AdamW(net.parameters(), 1e-3)
    t0 = time.perf_counter()
    for step in range(5):
        torch.manual_seed(100 * step + rank)  # each rank its own share of the data
        loss = net(torch.randn(32, 64, device=dev)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    copies = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(copies, flat)
    assert all(torch.equal(copies[0], c) for c in copies), "DDP replicas diverged"
    big = torch.ones(16 * 2**20, device=dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    for _ in range(5):
        dist.all_reduce(big)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    result = {"backend": backend, "world": world, "device": str(dev), "ddp_steps_s": round(t1 - t0, 3),
              "allreduce_64MB_x5_s": round(time.perf_counter() - t1, 3), "replicas_equal": True}
    if rank == 0:
        _write(out, result)
        print(json.dumps(result))
    del net, opt
    dist.barrier()
    D.cleanup()  # under gloo, lets its threads let go of the collectives' tensors before the interpreter exits


def compare(report: str, committed: str, out: str) -> int:
    """Each system's top-k of ``report`` inside ``committed``'s 95% interval for that system and k."""
    new, ref = json.loads(Path(report).read_text()), json.loads(Path(committed).read_text())
    rows, outside = [], []
    for system, r in ref["systems"].items():
        got = new.get("systems", {}).get(system)
        if got is None:
            outside.append(f"{system}: missing")
            continue
        for k, (lo, hi) in r.get("ci95", {}).items():
            value = got["top_k"].get(k)
            ok = value is not None and lo - 1e-9 <= value <= hi + 1e-9
            rows.append({"system": system, "k": k, "value": value, "ci95": [lo, hi], "ok": ok})
            if not ok:
                outside.append(f"{system} top-{k} {value} outside [{lo:.4f}, {hi:.4f}]")
    result = {"report": report, "committed": committed, "ok": not outside, "outside": outside, "rows": rows}
    _write(out, result)
    print(f"compare: {len(rows) - len([r for r in rows if not r['ok']])}/{len(rows)} figures inside the committed "
          f"intervals" + (f"; outside: {'; '.join(outside)}" if outside else ""))
    return 0 if not outside else 1


def tiny_model(out: str) -> None:
    """A 2-layer random BERT with MiniLM's tokenizer (the tests' tiny_model_dir), saved at ``out``: the one the
    benches build (scripts/profile_step.py)."""
    sys.path.insert(0, str(REPO / "scripts"))
    from profile_step import tiny_bert

    tiny_bert(Path(out))


def tiny_data(data_dir: str) -> None:
    """The tests' tiny dataset as ``<data_dir>/tiny`` (what `dpr-data` writes; the pipeline test's dev set)."""
    sys.path.insert(0, str(REPO))
    from tests.conftest import write_tiny_dataset
    from tests.system.test_pipeline import _distinct_dev

    root = write_tiny_dataset(Path(data_dir) / "tiny")
    _distinct_dev(root)  # dev and test questions apart, as the pipeline's own tests make them


def summary(out_dir: str) -> int:
    """``<OUT>/gpu_check.json`` (the interface of docs/results/gpu.md) from the stages' files; its last line."""
    out = Path(out_dir)

    def load(name: str) -> dict | None:
        p = out / name
        return json.loads(p.read_text()) if p.is_file() else None

    stages = {}
    if (out / "stages.tsv").is_file():  # written by gpu_check.sh: name, status, seconds, util mean, util max
        for line in (out / "stages.tsv").read_text().splitlines():
            name, status, secs, mean, peak = (line.split("\t") + [""] * 5)[:5]
            stages[name] = {"status": status, "seconds": float(secs) if secs else None,
                            "gpu_util": {"mean": float(mean), "max": float(peak)} if mean else None}
    bench = load("bench_gpu.json") or {}
    seconds = {name: s.get("seconds") for name, s in stages.items()}
    result = {
        "mode": os.environ.get("GPU_CHECK_MODE", "gpu"),
        "device": load("facts.json"),
        "stages": stages,
        "pipeline_seconds": seconds.get("pipeline"),
        "teacher_seconds": seconds.get("teacher"),
        "report_default": str(out / "report_default.json") if (out / "report_default.json").is_file() else None,
        "report_teacher": str(out / "report_teacher.json") if (out / "report_teacher.json").is_file() else None,
        "compare_default": load("compare_default.json"),
        "ddp": {k: load(f"ddp_{k}.json") for k in ("gloo", "nccl")},
        "train_examples_per_s": bench.get("train_examples_per_s", {"ours": None, "peer": None}),
        "encode_passages_per_s": bench.get("encode_passages_per_s", {"ours": None, "peer": None}),
        "gpu_util": {**{name: s.get("gpu_util") for name, s in stages.items()}, **(bench.get("gpu_util") or {})},
        "bench": str(out / "bench_gpu.json") if bench else None,
    }
    failed = [name for name, s in stages.items() if s.get("status") == "failed"]
    result["failed_stage"] = failed[0] if failed else None
    _write(out / "gpu_check.json", result)
    print(f"gpu_check: stage {failed[0]} failed" if failed else "gpu_check: all stages passed")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    from script_args import OneLineParser, json_output  # scripts/ is on sys.path (run by path from gpu_check.sh)

    ap = OneLineParser(prog="gpu_check_stages", description="the Python half of scripts/gpu_check.sh")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("facts", "tiny-model", "tiny-data", "summary"):
        sub.add_parser(name).add_argument("out")
    d = sub.add_parser("ddp")
    d.add_argument("out")
    d.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    d.add_argument("--device", default="cpu")
    c = sub.add_parser("compare")
    c.add_argument("report")
    c.add_argument("published")
    c.add_argument("out", type=json_output)
    args = ap.parse_args(argv)
    if args.cmd == "facts":
        facts(args.out)
    elif args.cmd == "ddp":
        ddp(args.out, args.backend, args.device)
    elif args.cmd == "compare":
        return compare(args.report, args.published, str(args.out))
    elif args.cmd == "tiny-model":
        tiny_model(args.out)
    elif args.cmd == "tiny-data":
        tiny_data(args.out)
    else:
        return summary(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
