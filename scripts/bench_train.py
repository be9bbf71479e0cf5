#!/usr/bin/env python
"""Training throughput: the project's trainer step against sentence-transformers' MultipleNegativesRankingLoss.

Both sides train all-MiniLM-L6-v2 from the same weights on the same batches (squad1_open train with
H BM25 hard negatives when prepared, else the tests' tiny set), with the same loss (softmax over
cosine similarity x 20 against in-batch + hard negatives), the same AdamW, clipping and sequence
limits, padding to each batch's longest text. Steps alternate (ours, theirs, ours, ...) so load
drift on a shared machine hits both alike.

- ours: ``dpr.training.data.collate`` + ``dpr.training.optim.optimizer_step`` (exactly what
  ``dpr.training.trainer.train`` runs per step), precision from ``--precision`` (auto: bf16 autocast
  on CPUs with native bf16).
- sentence-transformers: a manual loop over ``MultipleNegativesRankingLoss`` with its default fp32
  (what ``fit``/``SentenceTransformerTrainer`` run per step without AMP): ``model.tokenize`` per
  column, loss, backward, clip, AdamW step. Passages are given as ``"title [SEP] text"`` (the same
  tokens as our (title, text) pairs).

Rows (the JSON interface of `dpr.perf.report`, ``--json``): ours and the peer in fp32, and in bf16
where the CPU has native bf16 (``--no-bf16`` / ``DPR_NO_BF16=1`` pretends it has not); each row trains
its own copy from the same weights, all rows step in turn. MFU (ours): 3 × the forward FLOPs of the
padded question and passage batches each step computes on (`dpr.perf.flops`), over the step time and
the matmul peak measured here in that precision (`dpr.perf.peak`). ``ours-fused-adamw``: ours in the default
precision with ``train.optimizer_impl=fused`` (one fused AdamW kernel; the default is foreach). Every row lists
the config keys it sets in ``levers``.

    .venv/bin/python scripts/bench_train.py --json bench_train.json          # 10 steps each, batch 16, H=1
    .venv/bin/python scripts/bench_train.py --steps 30 --batch-size 32 --json bench_train.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _dataset(data_dir: Path, name: str) -> tuple[Path, str]:
    train = data_dir / name / "train.json"
    if train.is_file():
        return train, f"{name} ({train})"
    sys.path.insert(0, str(REPO))  # tests/ is a package: under pytest this is the conftest it already loaded
    from tests.conftest import write_tiny_dataset  # the tests' tiny set

    root = write_tiny_dataset(Path(tempfile.mkdtemp(prefix="bench_train_")) / "tiny")
    return root / "train.json", f"tiny set ({name} not prepared under {data_dir})"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=REPO / "data" / "prepared")
    ap.add_argument("--data", default="squad1_open")
    ap.add_argument("--model", default="all-MiniLM-L6-v2", help="alias or HF model dir (tests: a tiny BERT)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--hard-negatives", type=int, default=1)
    ap.add_argument("--question-max-length", type=int, default=64)
    ap.add_argument("--passage-max-length", type=int, default=192)
    ap.add_argument("--precision", default="auto", help="our default precision: auto|fp32|bf16")
    ap.add_argument("--st-precision", default="fp32", help="the peer's default: fp32 (its default) or bf16")
    ap.add_argument("--no-bf16", action="store_true", help="pretend the CPU lacks native bf16 (DPR_NO_BF16=1)")
    ap.add_argument("--peak-n", type=int, default=2048, help="matmul size for the measured peak")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here (dpr/perf/report.py)")
    args = ap.parse_args(argv)
    if args.no_bf16:
        os.environ["DPR_NO_BF16"] = "1"

    from sentence_transformers import SentenceTransformer
    try:  # sentence-transformers >= 6 moved the losses
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:
        from sentence_transformers.losses import MultipleNegativesRankingLoss

    from dpr.atomic import write_json_atomic
    from dpr.losses import SoftmaxNLLLoss
    from dpr.models import load_biencoder
    from dpr.models.hub import resolve_model_name
    from dpr.perf import cpu_supports_bf16, matmul_peak_gflops, mfu, total_flops
    from dpr.perf.report import bench_report, format_table, row
    from dpr.training.data import TrainBatches, load_examples
    from dpr.training.grad_cache import standard_step
    from dpr.training.optim import build_optimizer, linear_schedule, optimizer_step
    from dpr.training.steps import bind_loss
    from dpr.training.trainer import _autocast, resolve_precision

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    train_path, data_desc = _dataset(args.data_dir, args.data)
    examples = load_examples(train_path)
    batch_size = min(args.batch_size, len(examples))
    default = resolve_precision(args.precision, device)
    precisions = ["fp32"] + (["bf16"] if cpu_supports_bf16() else [])
    peer = "sentence-transformers"
    model_kw = dict(shared=True, pooling="mean", similarity="cosine", temperature=0.05,
                    question_max_length=args.question_max_length, passage_max_length=args.passage_max_length)
    tokenizer = load_biencoder(args.model, **model_kw)[1]
    # answer masking off: MultipleNegativesRankingLoss has none, so both train the same objective
    batches = TrainBatches(examples, tokenizer, batch_size=batch_size, hard_negatives=args.hard_negatives,
                           question_max_length=args.question_max_length,
                           passage_max_length=args.passage_max_length, seed=args.seed, mask_answers=False)
    per_epoch = batches.num_batches(0)
    plan = [(i // per_epoch, i % per_epoch) for i in range(args.steps)]

    def make_ours(precision: str, impl: str = "auto"):
        torch.manual_seed(args.seed)
        model = load_biencoder(args.model, **model_kw)[0]
        model.train()
        opt = build_optimizer(model, args.lr, 0.01, impl=impl)
        sched = linear_schedule(opt, 0, args.steps)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        autocast, loss, outputs = _autocast(precision, device), SoftmaxNLLLoss(), []
        config = model.question_encoder.config

        def step(epoch: int, b: int, items) -> tuple[float, int]:
            outputs.clear()
            batch = next(batches.iter_epoch(epoch, start=b))
            loss_fn = bind_loss(loss, model.similarity, batch, corpus=None, frozen=False, accum=1, scaler=scaler,
                                outputs=outputs)
            optimizer_step(model, [(batch.q_inputs, batch.p_inputs, loss_fn)], step_fn=standard_step,
                           autocast=autocast, optimizer=opt, scheduler=sched, scaler=scaler,
                           max_grad_norm=args.max_grad_norm, device=device)
            shapes = [tuple(batch.q_inputs["input_ids"].shape), tuple(batch.p_inputs["input_ids"].shape)]
            return float(outputs[0].loss.detach()), total_flops(config, shapes, training=True)
        return step

    def fmt(ctx: dict) -> str:
        return f"{ctx['title']} [SEP] {ctx['text']}" if ctx.get("title") else ctx["text"]

    def make_st(precision: str):
        torch.manual_seed(args.seed)
        st = SentenceTransformer(resolve_model_name(args.model), device="cpu")
        st.max_seq_length = args.passage_max_length
        st.train()
        mnrl = MultipleNegativesRankingLoss(st)  # scale 20, cosine: the same objective as ours
        opt = build_optimizer(st, args.lr, 0.01)
        sched = linear_schedule(opt, 0, args.steps)
        tokenize = getattr(st, "preprocess", None) or st.tokenize  # renamed in sentence-transformers 6

        def step(epoch: int, b: int, items) -> tuple[float, None]:
            columns = [[it.question for it in items]] + [
                [fmt(it.passages[j]) for it in items] for j in range(1 + args.hard_negatives)
            ]
            features = [tokenize(col) for col in columns]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = mnrl(features, None)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(st.parameters(), args.max_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            return float(loss.detach()), None
        return step

    sides = {}
    for p in precisions:
        sides[("ours", p)] = make_ours(p)
        sides[(peer, p)] = make_st(p)
    sides[("ours-fused-adamw", default)] = make_ours(default, impl="fused")
    levers = {("ours", "bf16"): ["train.precision=bf16"], ("ours", "fp32"): ["train.precision=fp32"],
              ("ours-fused-adamw", default): [f"train.precision={default}", "train.optimizer_impl=fused"],
              (peer, "bf16"): ["torch.autocast(bfloat16)"]}
    res = {key: {"times": [], "losses": [], "flops": []} for key in sides}
    for i, (epoch, b) in enumerate(plan):
        items = batches.items(epoch, b)
        for key, step in sides.items():  # round-robin: load drift hits every row alike
            t = time.perf_counter()
            loss_value, flops = step(epoch, b, items)
            res[key]["times"].append(time.perf_counter() - t)
            res[key]["losses"].append(loss_value)
            res[key]["flops"].append(flops)
        print(f"step {i + 1}/{args.steps}: " + " | ".join(
            f"{k[0]} {k[1]} {v['times'][-1]:.2f}s loss {v['losses'][-1]:.4f}" for k, v in res.items()), flush=True)
    peaks = {p: matmul_peak_gflops(p, args.peak_n) for p in precisions}

    rows = []
    for (system, p), side in res.items():
        timed = slice(1, None) if len(side["times"]) > 1 else slice(None)  # the first step pays kernel set-up
        secs = sum(side["times"][timed])
        ours = system.startswith("ours")
        flops = sum(side["flops"][timed]) if ours else 0
        rows.append(row(system, p, batch_size * len(side["times"][timed]) / secs,
                        mfu(flops, secs, peaks.get(p)) if ours else None, levers=levers.get((system, p), []),
                        median_step_s=round(sorted(side["times"][timed])[len(side["times"][timed]) // 2], 3),
                        first_loss=round(side["losses"][0], 4), last_loss=round(side["losses"][-1], 4),
                        mean_loss=round(sum(side["losses"]) / len(side["losses"]), 4)))
    summary = bench_report(
        rows, peer, default, peaks, data=data_desc, steps=args.steps, batch_size=batch_size,
        hard_negatives=args.hard_negatives, question_max_length=args.question_max_length,
        passage_max_length=args.passage_max_length, threads=torch.get_num_threads(), unit="examples/s",
        peer_default=args.st_precision)
    print()
    print(f"data: {data_desc}; {args.steps} steps, batch {batch_size}, H={args.hard_negatives}, "
          f"max lengths q={args.question_max_length} p={args.passage_max_length}, {torch.get_num_threads()} threads")
    print(format_table(summary, [("examples/s", "per_s", ".2f"), ("MFU", "mfu", ""),
                                 ("median s/step", "median_step_s", ".2f"), ("mean loss", "mean_loss", ".4f")]))
    if args.json:
        write_json_atomic(args.json, summary)
    return summary


if __name__ == "__main__":
    main()
