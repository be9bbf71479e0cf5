#!/usr/bin/env python
"""Training throughput: the step ``dpr-train`` runs by default against sentence-transformers' MultipleNegativesRankingLoss.

Both sides train all-MiniLM-L6-v2 from the same weights on the same batches (squad1_open train with
H BM25 hard negatives when prepared, else the tests' tiny set), with the same loss (softmax over
cosine similarity x 20 against in-batch + hard negatives), the same AdamW, clipping and sequence
limits. Steps alternate (ours, theirs, ours, ...) so load drift on a shared machine hits every row alike.

- ``ours``: exactly ``dpr-train``'s default two-tower step (`dpr.training.trainer.Trainer.fit`): the batch
  collated by ``TrainBatches``, each tower encoded in length-sorted buckets of ``train.length_bucket_size``
  rows (`dpr.models.length_buckets`), ``optimizer_step`` with ``train.optimizer_impl``'s AdamW (auto =
  foreach), the divergence check; precision ``train.precision`` (auto: bf16 autocast on CPUs with native
  bf16); glibc malloc tuned as ``dpr-train`` tunes it (`dpr.perf.malloc.keep_freed_memory`, called at the
  start of ``dpr.training.train.train``; here at the start of this process, which runs only our rows).
  The defaults are read from ``TrainConfig``, so the row follows them if they change. Two choices keep the
  objective the peer's instead of dpr-train's defaults: one shared tower, as the peer trains one model
  (``--separate-towers``: the minilm preset's two towers, the same FLOPs per step plus a second tower's
  AdamW update), and no answer masking (``train.mask_answers`` on QA data: the peer has none).
- ``ours-padded``: the lever row of one forward per tower padded to the batch's longest text
  (``train.length_bucket_size=0``, the step before buckets existed), in our default precision;
  ``ours-fused-adamw``: ``train.optimizer_impl=fused``, in our default precision; ``ours-no-attn-dropout``:
  ``train.attention_dropout=0`` (no attention-dropout masks, SDPA's fused kernel; `dpr.models.dropout`), in our
  default precision.
- sentence-transformers (its own process, glibc's default malloc: the peer keeps its defaults): a manual
  loop over ``MultipleNegativesRankingLoss`` with its default fp32 (what ``fit``/``SentenceTransformerTrainer``
  run per step without AMP): ``model.tokenize`` per column (padded to the column's longest), loss, backward,
  clip, AdamW step; and its same-precision variant under ``torch.autocast(bfloat16)``. Passages are given
  as ``"title [SEP] text"`` (the same tokens as our (title, text) pairs). The parent sends each step's
  examples; the peer times its own step (the pipe is outside the time).

Rows (the JSON interface of `dpr.perf.report`, ``--json``): ours and the peer in fp32, and in bf16 where the
CPU has native bf16 (``--no-bf16`` / ``DPR_NO_BF16=1`` pretends it has not); each row trains its own copy from
the same weights. ``ratio.fp32`` / ``ratio.bf16``: the ``ours`` row (the default step) over the peer in that
precision. Every row lists the config keys it sets in ``levers`` and what its step ran in ``settings``
(bucket size, AdamW kernels, malloc tuning, padding). MFU (ours): 3 x the forward FLOPs of the shapes each
step computes on (each bucket padded to its own longest; `dpr.perf.flops`), over the step time and the matmul
peak measured here in that precision (`dpr.perf.peak`).

    .venv/bin/python scripts/bench_train.py --json bench_train.json          # 10 steps each, batch 16, H=1
    .venv/bin/python scripts/bench_train.py --steps 30 --batch-size 32 --json bench_train.json
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from script_args import OneLineParser, json_output, real, whole  # noqa: E402  (scripts/ is on sys.path)

REPO = Path(__file__).resolve().parents[1]
PEER = "sentence-transformers"


def dataset(data_dir: Path, name: str) -> tuple[Path, str]:
    """The training file to bench on and its description: ``<data_dir>/<name>/train.json``, else the tests' tiny set."""
    train = data_dir / name / "train.json"
    if train.is_file():
        return train, f"{name} ({train})"
    sys.path.insert(0, str(REPO))  # tests/ is a package: under pytest this is the conftest it already loaded
    from tests.conftest import write_tiny_dataset  # the tests' tiny set

    root = write_tiny_dataset(Path(tempfile.mkdtemp(prefix="bench_train_")) / "tiny")
    return root / "train.json", f"tiny set ({name} not prepared under {data_dir})"


def computed_shapes(inputs: dict, bucket_size: int) -> list[tuple[int, int]]:
    """The ``(rows, length)`` shapes a tower's forward computes on: the padded batch, or with ``bucket_size``
    each length-sorted bucket cut to its own longest (what `dpr.models.length_buckets.encode_bucketed` runs)."""
    from dpr.models.length_buckets import length_order, trim_padding

    ids, mask = inputs["input_ids"], inputs.get("attention_mask")
    if bucket_size <= 0 or ids.shape[0] <= bucket_size or mask is None:
        return [tuple(ids.shape)]
    return [tuple(trim_padding({"input_ids": ids[rows], "attention_mask": mask[rows]})["input_ids"].shape)
            for rows in length_order(mask).split(bucket_size)]


def ours_step(model_name: str, model_kw: dict, batches, precision: str, *, steps: int, lr: float,
              max_grad_norm: float, bucket_size: int, impl: str, seed: int,
              attention_dropout: float | None = None, device: str = "cpu") -> Callable:
    """``step(epoch, batch_in_epoch) -> (loss, shapes)``: one of ``dpr-train``'s two-tower steps (module doc)
    on a fresh copy of the model, with this bucket size, AdamW implementation, precision and attention dropout
    (None: the model's own, as ``train.attention_dropout=null``)."""
    from dpr.losses import SoftmaxNLLLoss
    from dpr.models import load_biencoder
    from dpr.models.dropout import set_attention_dropout
    from dpr.training.steps import bind_loss, make_step, optimizer_step
    from dpr.training.trainer import check_step_finite
    from dpr.trainkit.optim import build_optimizer, linear_schedule
    from dpr.trainkit.precision import autocast_factory

    device = torch.device(device)
    torch.manual_seed(seed)
    model = load_biencoder(model_name, **model_kw)[0].to(device)
    model.train()
    if attention_dropout is not None:  # what dpr.training.train does with train.attention_dropout
        set_attention_dropout(model, attention_dropout)
    opt = build_optimizer(model, lr, 0.01, impl=impl)
    sched = linear_schedule(opt, 0, steps)
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    autocast, loss, outputs = autocast_factory(device, precision), SoftmaxNLLLoss(), []
    step_fn = make_step(0, bucket_size)  # what dpr.training.train builds from train.length_bucket_size
    done = [0]

    def step(epoch: int, b: int) -> tuple[float, list[tuple[int, int]]]:
        outputs.clear()
        batch = next(batches.iter_epoch(epoch, start=b))
        loss_fn = bind_loss(loss, model.similarity, batch, corpus=None, frozen=False, accum=1, scaler=scaler,
                            outputs=outputs)
        lr_now, grad_norm = optimizer_step(model, [(batch.q_inputs, batch.p_inputs, loss_fn)], step_fn=step_fn,
                                           autocast=autocast, optimizer=opt, scheduler=sched, scaler=scaler,
                                           max_grad_norm=max_grad_norm, device=device)
        done[0] += 1
        check_step_finite(done[0], float(torch.stack([o.loss.detach().float() for o in outputs]).sum()),
                          grad_norm, model, lr=lr_now)
        shapes = computed_shapes(batch.q_inputs, bucket_size) + computed_shapes(batch.p_inputs, bucket_size)
        return float(outputs[0].loss.detach()), shapes
    step.config = model.question_encoder.config  # for the FLOPs of the shapes
    return step


def _peer_side(cfg: dict, precision: str) -> Callable:
    """The peer's step on its own copy of the model: ``step(items) -> loss``."""
    from sentence_transformers import SentenceTransformer
    try:  # sentence-transformers >= 6 moved the losses
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:
        from sentence_transformers.losses import MultipleNegativesRankingLoss

    from dpr.models.hub import resolve_model_name
    from dpr.trainkit.optim import build_optimizer, linear_schedule

    torch.manual_seed(cfg["seed"])
    device = cfg.get("device", "cpu")
    st = SentenceTransformer(resolve_model_name(cfg["model"]), device=device)
    st.max_seq_length = cfg["passage_max_length"]
    st.train()
    mnrl = MultipleNegativesRankingLoss(st)  # scale 20, cosine: the same objective as ours
    opt = build_optimizer(st, cfg["lr"], 0.01)
    sched = linear_schedule(opt, 0, cfg["steps"])
    tokenize = getattr(st, "preprocess", None) or st.tokenize  # renamed in sentence-transformers 6

    def fmt(ctx: dict) -> str:
        return f"{ctx['title']} [SEP] {ctx['text']}" if ctx.get("title") else ctx["text"]

    def step(items) -> float:
        columns = [[it.question for it in items]] + [
            [fmt(it.passages[j]) for it in items] for j in range(1 + cfg["hard_negatives"])]
        features = [tokenize(col) for col in columns]
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = mnrl(features, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(st.parameters(), cfg["max_grad_norm"])
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        value = float(loss.detach())
        if torch.device(device).type == "cuda":  # the optimizer's kernels are in the step's time too
            torch.cuda.synchronize()
        return value
    return step


def _peer_worker(conn, cfg: dict) -> None:
    """The peer's process (spawned: glibc's default malloc, nothing of ours loaded but the data types): one
    side per precision; each message ``(precision, items)`` is one timed step, answered ``(loss, seconds)``."""
    try:
        torch.set_num_threads(cfg["threads"])
        sides = {p: _peer_side(cfg, p) for p in cfg["precisions"]}
        conn.send(("ready", None))
        while (msg := conn.recv()) is not None:
            precision, items = msg
            t = time.perf_counter()
            loss = sides[precision](items)
            conn.send((loss, time.perf_counter() - t))
    except Exception:  # noqa: BLE001 - the parent reports it
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


class Peer:
    """The peer's process, driven step by step from this one."""

    def __init__(self, cfg: dict) -> None:
        here = str(Path(__file__).resolve().parent)
        if here not in sys.path:  # the spawned child unpickles _peer_worker from this module by name
            sys.path.insert(0, here)
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_peer_worker, args=(child, cfg), daemon=True)
        self.proc.start()
        child.close()
        self._answer()

    def _answer(self) -> Any:
        try:
            first, second = self.conn.recv()
        except EOFError:
            raise SystemExit(f"the {PEER} process died (exit {self.proc.exitcode})") from None
        if first == "error":
            raise SystemExit(f"the {PEER} process failed:\n{second}")
        return first, second

    def step(self, precision: str, items) -> tuple[float, float]:
        self.conn.send((precision, items))
        return self._answer()

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(timeout=30)


def main(argv: list[str] | None = None) -> dict:
    from dpr.perf.malloc import keep_freed_memory

    malloc_tuned = keep_freed_memory()  # as dpr-train does first thing; this process runs only our rows
    from dpr.training.config import TrainConfig

    defaults = TrainConfig()
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=REPO / "data" / "prepared")
    ap.add_argument("--data", default="squad1_open")
    ap.add_argument("--model", default="all-MiniLM-L6-v2", help="alias or HF model dir (tests: a tiny BERT)")
    ap.add_argument("--steps", type=whole(2), default=10)
    ap.add_argument("--batch-size", type=whole(1), default=16)
    ap.add_argument("--hard-negatives", type=whole(0), default=1)
    ap.add_argument("--question-max-length", type=whole(1), default=64)
    ap.add_argument("--passage-max-length", type=whole(1), default=192)
    ap.add_argument("--precision", default=defaults.precision, help="our precision: auto (default) | fp32 | bf16")
    ap.add_argument("--st-precision", default="fp32", help="the peer's default: fp32 (its default) or bf16")
    ap.add_argument("--no-bf16", action="store_true", help="pretend the CPU lacks native bf16 (DPR_NO_BF16=1)")
    ap.add_argument("--separate-towers", action="store_true", help="ours with two towers (the minilm preset's)")
    ap.add_argument("--peak-n", type=whole(1), default=2048, help="matmul size for the measured peak")
    ap.add_argument("--lr", type=real(0, lo_open=True), default=defaults.lr)
    ap.add_argument("--max-grad-norm", type=real(0), default=1.0)
    ap.add_argument("--threads", type=whole(0), default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--seed", type=whole(0), default=42)
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N: both sides train there (scripts/bench_gpu.py)")
    ap.add_argument("--json", type=json_output, default=None, help="also write the results here (dpr/perf/report.py)")
    args = ap.parse_args(argv)
    if args.no_bf16:
        os.environ["DPR_NO_BF16"] = "1"

    from dpr.atomic import write_json_atomic
    from dpr.models import BiEncoderConfig, load_biencoder
    from dpr.perf import cpu_supports_bf16, matmul_peak_gflops, mfu, total_flops
    from dpr.perf.report import bench_report, format_table, row
    from dpr.training.batching import TrainBatches, load_examples
    from dpr.trainkit.optim import resolve_optimizer_impl
    from dpr.trainkit.precision import resolve_precision

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    train_path, data_desc = dataset(args.data_dir, args.data)
    examples = load_examples(train_path)
    batch_size = min(args.batch_size, len(examples))
    device = torch.device(args.device)
    default = resolve_precision(args.precision, device, training=True)
    bf16 = torch.cuda.is_bf16_supported() if device.type == "cuda" else cpu_supports_bf16()
    precisions = ["fp32"] + (["bf16"] if bf16 and not args.no_bf16 else [])
    model_kw = dict(shared=not args.separate_towers, pooling="mean", similarity="cosine", temperature=0.05,
                    question_max_length=args.question_max_length, passage_max_length=args.passage_max_length)
    tokenizer = load_biencoder(args.model, **model_kw)[1]
    # answer masking off: MultipleNegativesRankingLoss has none, so both train the same objective
    batches = TrainBatches(examples, tokenizer, TrainConfig(batch_size=batch_size, hard_negatives=args.hard_negatives),
                           BiEncoderConfig(**model_kw), seed=args.seed, mask_answers=False)
    per_epoch = batches.num_batches(0)
    plan = [(i // per_epoch, i % per_epoch) for i in range(args.steps)]

    # the bucket size dpr-train's auto picks on the device the bench runs on
    bucket, impl = defaults.bucket_size_for(device), defaults.optimizer_impl
    common = dict(steps=args.steps, lr=args.lr, max_grad_norm=args.max_grad_norm, seed=args.seed, device=args.device)
    # (system, precision) -> (bucket size, AdamW implementation, attention dropout (None: the model's own),
    # levers: the config keys the row sets)
    attn = defaults.attention_dropout
    ours_rows = {("ours", p): (bucket, impl, attn, [f"train.precision={p}"]) for p in precisions}
    ours_rows[("ours-padded", default)] = (0, impl, attn, [f"train.precision={default}", "train.length_bucket_size=0"])
    ours_rows[("ours-fused-adamw", default)] = (bucket, "fused", attn, [f"train.precision={default}",
                                                                        "train.optimizer_impl=fused"])
    ours_rows[("ours-no-attn-dropout", default)] = (bucket, impl, 0.0, [f"train.precision={default}",
                                                                        "train.attention_dropout=0"])
    sides = {key: ours_step(args.model, model_kw, batches, key[1], bucket_size=b, impl=i, attention_dropout=a,
                            **common)
             for key, (b, i, a, _) in ours_rows.items()}
    # the attention dropout is named only where a row sets it (the other rows' settings keep their shape)
    settings = {key: {"length_bucket_size": b, "optimizer_impl": resolve_optimizer_impl(i),
                      "malloc_tuned": malloc_tuned, "towers": "separate" if args.separate_towers else "shared",
                      "mask_answers": False, **({"attention_dropout": a} if a is not None else {})}
                for key, (b, i, a, _) in ours_rows.items()}
    levers = {key: lv for key, (_, _, _, lv) in ours_rows.items()}
    peer = Peer({"model": args.model, "seed": args.seed, "lr": args.lr, "steps": args.steps,
                 "max_grad_norm": args.max_grad_norm, "passage_max_length": args.passage_max_length,
                 "hard_negatives": args.hard_negatives, "threads": torch.get_num_threads(), "precisions": precisions,
                 "device": args.device})
    for p in precisions:
        settings[(PEER, p)] = {"padding": "longest", "optimizer_impl": "foreach", "malloc_tuned": False,
                               "towers": "shared"}
        levers[(PEER, p)] = ["torch.autocast(bfloat16)"] if p == "bf16" else []
    order = [k for p in precisions for k in (("ours", p), (PEER, p))] + [k for k in ours_rows if k[0] != "ours"]
    res = {key: {"times": [], "losses": [], "shapes": []} for key in order}
    config = sides[("ours", "fp32")].config
    try:
        for i, (epoch, b) in enumerate(plan):
            items = batches.items(epoch, b)
            for key in order:  # round-robin: load drift hits every row alike
                if key[0] == PEER:
                    loss_value, secs = peer.step(key[1], items)
                    shapes = None
                else:
                    t = time.perf_counter()
                    loss_value, shapes = sides[key](epoch, b)
                    if device.type == "cuda":  # the step's queued kernels (optimizer included) in its time
                        torch.cuda.synchronize()
                    secs = time.perf_counter() - t
                res[key]["times"].append(secs)
                res[key]["losses"].append(loss_value)
                res[key]["shapes"].append(shapes)
            print(f"step {i + 1}/{args.steps}: " + " | ".join(
                f"{k[0]} {k[1]} {v['times'][-1]:.2f}s loss {v['losses'][-1]:.4f}" for k, v in res.items()), flush=True)
    finally:
        peer.close()
    peaks = {p: matmul_peak_gflops(p, args.peak_n, device=device) for p in precisions}

    rows = []
    for (system, p), side in res.items():
        timed = slice(1, None)  # the first step pays kernel set-up (--steps >= 2: checked with the arguments)
        secs = sum(side["times"][timed])
        ours = system.startswith("ours")
        shapes = [s for step_shapes in side["shapes"][timed] for s in (step_shapes or [])]
        extra = {"tokens_per_step": round(sum(n * s for n, s in shapes) / len(side["times"][timed]))} if ours else {}
        rows.append(row(system, p, batch_size * len(side["times"][timed]) / secs,
                        mfu(total_flops(config, shapes, training=True), secs, peaks.get(p)) if ours else None,
                        levers=levers[(system, p)], settings=settings[(system, p)],
                        median_step_s=round(sorted(side["times"][timed])[len(side["times"][timed]) // 2], 3),
                        first_loss=round(side["losses"][0], 4), last_loss=round(side["losses"][-1], 4),
                        mean_loss=round(sum(side["losses"]) / len(side["losses"]), 4), **extra))
    summary = bench_report(
        rows, PEER, default, peaks, data=data_desc, steps=args.steps, batch_size=batch_size,
        hard_negatives=args.hard_negatives, question_max_length=args.question_max_length,
        passage_max_length=args.passage_max_length, threads=torch.get_num_threads(), unit="examples/s",
        device=str(device),
        peer_default=args.st_precision, malloc_tuning={"ours": malloc_tuned, PEER: False},
        defaults={"length_bucket_size": bucket, "optimizer_impl": resolve_optimizer_impl(impl),
                  "precision": f"{args.precision} -> {default}"})
    print()
    print(f"data: {data_desc}; {args.steps} steps, batch {batch_size}, H={args.hard_negatives}, "
          f"max lengths q={args.question_max_length} p={args.passage_max_length}, {torch.get_num_threads()} threads; "
          f"ours: buckets of {bucket}, AdamW {resolve_optimizer_impl(impl)}, malloc tuned: {malloc_tuned}")
    print(format_table(summary, [("examples/s", "per_s", ".2f"), ("MFU", "mfu", ""),
                                 ("median s/step", "median_step_s", ".2f"), ("mean loss", "mean_loss", ".4f")]))
    if args.json:
        write_json_atomic(args.json, summary)
    return summary


if __name__ == "__main__":
    main()
