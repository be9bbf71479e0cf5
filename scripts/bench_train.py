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

    .venv/bin/python scripts/bench_train.py                        # 10 steps each, batch 16, H=1
    .venv/bin/python scripts/bench_train.py --steps 30 --batch-size 32 --json bench.json
"""

from __future__ import annotations

import argparse
import json
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
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import write_tiny_dataset  # the tests' tiny set

    root = write_tiny_dataset(Path(tempfile.mkdtemp(prefix="bench_train_")) / "tiny")
    return root / "train.json", f"tiny set ({name} not prepared under {data_dir})"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=REPO / "data" / "prepared")
    ap.add_argument("--data", default="squad1_open")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--hard-negatives", type=int, default=1)
    ap.add_argument("--question-max-length", type=int, default=64)
    ap.add_argument("--passage-max-length", type=int, default=192)
    ap.add_argument("--precision", default="auto", help="ours: auto|fp32|bf16")
    ap.add_argument("--st-precision", default="fp32", help="sentence-transformers: fp32 (its default) or bf16")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)

    from sentence_transformers import SentenceTransformer
    try:  # sentence-transformers >= 6 moved the losses
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:
        from sentence_transformers.losses import MultipleNegativesRankingLoss

    from dpr.models import load_biencoder
    from dpr.models.hub import default_model_path
    from dpr.training.data import TrainBatches, load_examples
    from dpr.training.grad_cache import standard_step
    from dpr.losses import SoftmaxNLLLoss
    from dpr.training.optim import build_optimizer, linear_schedule, optimizer_step
    from dpr.training.steps import bind_loss
    from dpr.training.trainer import _autocast, resolve_precision

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    train_path, data_desc = _dataset(args.data_dir, args.data)
    examples = load_examples(train_path)
    batch_size = min(args.batch_size, len(examples))
    precision = resolve_precision(args.precision, device)

    torch.manual_seed(args.seed)
    ours, tokenizer = load_biencoder(
        "all-MiniLM-L6-v2", shared=True, pooling="mean", similarity="cosine", temperature=0.05,
        question_max_length=args.question_max_length, passage_max_length=args.passage_max_length,
    )
    ours.train()
    st = SentenceTransformer(default_model_path(), device="cpu")
    st.max_seq_length = args.passage_max_length
    st.train()
    mnrl = MultipleNegativesRankingLoss(st)  # scale 20, cosine: the same objective as ours

    # answer masking off: MultipleNegativesRankingLoss has none, so both train the same objective
    batches = TrainBatches(examples, tokenizer, batch_size=batch_size, hard_negatives=args.hard_negatives,
                           question_max_length=args.question_max_length,
                           passage_max_length=args.passage_max_length, seed=args.seed, mask_answers=False)
    per_epoch = batches.num_batches(0)
    plan = [(i // per_epoch, i % per_epoch) for i in range(args.steps)]

    o_opt = build_optimizer(ours, args.lr, 0.01)
    o_sched = linear_schedule(o_opt, 0, args.steps)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    outputs: list = []
    loss = SoftmaxNLLLoss()
    autocast = _autocast(precision, device)

    s_opt = build_optimizer(st, args.lr, 0.01)
    s_sched = linear_schedule(s_opt, 0, args.steps)
    s_autocast = args.st_precision == "bf16"

    def fmt(ctx: dict) -> str:
        return f"{ctx['title']} [SEP] {ctx['text']}" if ctx.get("title") else ctx["text"]

    res = {"ours": {"times": [], "losses": []}, "st": {"times": [], "losses": []}}
    for step, (epoch, b) in enumerate(plan):
        items = batches.items(epoch, b)
        # ours
        t = time.perf_counter()
        outputs.clear()
        batch = next(batches.iter_epoch(epoch, start=b))
        loss_fn = bind_loss(loss, ours.similarity, batch, corpus=None, frozen=False, accum=1, scaler=scaler,
                            outputs=outputs)
        optimizer_step(ours, [(batch.q_inputs, batch.p_inputs, loss_fn)], step_fn=standard_step, autocast=autocast,
                       optimizer=o_opt, scheduler=o_sched, scaler=scaler, max_grad_norm=args.max_grad_norm, device=device)
        res["ours"]["times"].append(time.perf_counter() - t)
        res["ours"]["losses"].append(float(outputs[0].loss.detach()))
        # sentence-transformers
        t = time.perf_counter()
        columns = [[it.question for it in items]] + [
            [fmt(it.passages[j]) for it in items] for j in range(1 + args.hard_negatives)
        ]
        tokenize = getattr(st, "preprocess", None) or st.tokenize  # renamed in sentence-transformers 6
        features = [tokenize(col) for col in columns]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=s_autocast):
            loss = mnrl(features, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(st.parameters(), args.max_grad_norm)
        s_opt.step()
        s_sched.step()
        s_opt.zero_grad(set_to_none=True)
        res["st"]["times"].append(time.perf_counter() - t)
        res["st"]["losses"].append(float(loss.detach()))
        print(f"step {step + 1}/{args.steps}: ours {res['ours']['times'][-1]:.2f}s loss {res['ours']['losses'][-1]:.4f} | "
              f"st {res['st']['times'][-1]:.2f}s loss {res['st']['losses'][-1]:.4f}", flush=True)

    def rate(times: list[float]) -> float:
        timed = times[1:] if len(times) > 1 else times  # the first step pays one-off kernel set-up
        return batch_size * len(timed) / sum(timed)

    def median(times: list[float]) -> float:
        timed = sorted(times[1:] if len(times) > 1 else times)
        return timed[len(timed) // 2]

    for side in res.values():
        side["examples_per_s"] = rate(side["times"])
        side["median_step_s"] = median(side["times"])
        side["min_step_s"] = min(side["times"])
    ratio = res["ours"]["examples_per_s"] / res["st"]["examples_per_s"]
    summary = {
        "data": data_desc, "steps": args.steps, "batch_size": batch_size, "hard_negatives": args.hard_negatives,
        "question_max_length": args.question_max_length, "passage_max_length": args.passage_max_length,
        "threads": torch.get_num_threads(), "ours_precision": precision, "st_precision": args.st_precision,
        "ours": res["ours"], "st": res["st"], "ratio": ratio,
        "ratio_median": res["st"]["median_step_s"] / res["ours"]["median_step_s"],
    }
    print()
    print(f"data: {data_desc}; {args.steps} steps, batch {batch_size}, H={args.hard_negatives}, "
          f"max lengths q={args.question_max_length} p={args.passage_max_length}, {torch.get_num_threads()} threads")
    print(f"{'':30s} {'examples/s':>10s} {'median s/step':>13s} {'min s/step':>10s} {'first loss':>10s} {'last loss':>10s}")
    for key, label in (("ours", f"dpr trainer ({precision})"), ("st", f"sentence-transformers ({args.st_precision})")):
        side = res[key]
        print(f"{label:30s} {side['examples_per_s']:10.2f} {side['median_step_s']:13.2f} {side['min_step_s']:10.2f} "
              f"{side['losses'][0]:10.4f} {side['losses'][-1]:10.4f}")
    print(f"speed-up: {ratio:.2f}x in examples/s (all steps but each side's first), "
          f"{summary['ratio_median']:.2f}x in median step time")
    mean_loss = {k: sum(v["losses"]) / len(v["losses"]) for k, v in res.items()}
    print(f"mean loss over the run: ours {mean_loss['ours']:.4f}, sentence-transformers {mean_loss['st']:.4f}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
