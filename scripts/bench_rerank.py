#!/usr/bin/env python
"""Cross-encoder speed: our reranker scoring and training step against sentence-transformers' CrossEncoder,
on the same exported model, the same pairs, in the same precision with the same threads, in one run.

    .venv/bin/python scripts/bench_rerank.py --results runs/squad1_open_teacher/bm25/dev.json --json bench_rerank.json
    .venv/bin/python scripts/bench_rerank.py --threads 2 --precision both --pairs 1000 --steps 10 --json f.json

Model: a fresh cross-encoder on ``--model`` (all-MiniLM-L6-v2's offline copy by default; its one-logit head
seeded by ``--seed``) saved as our cross-encoder directory, or a trained one (``--model <dpr-rerank output>``);
it is then exported with `dpr.export.cross_encoder.export_cross_encoder` (what ``dpr-export
format=sentence-transformers`` writes), and the peer loads that export with ``CrossEncoder(<dir>)``: both
sides run the same weights.

(a) scoring (``score`` in the JSON): ours is `dpr.rerank.score.score_pairs` (tokenize once, sort by token
length, inference mode); the peer is ``CrossEncoder.predict`` (its own length sort; the export's Identity
activation, so it returns the logit too). Pairs: each question's top ``--k`` ctxs of a DPR results file
(``--results``), else each question's positive and hard negatives of ``<data-dir>/<data>/dev.json``, else
synthetic text (tests); passages as ``title [SEP] text`` for both. Timed round-robin, ``--repeats``
rounds after ``--warmup`` untimed ones, median kept. Each row carries its largest score difference
against our fp32 scores (the like-for-like check: both fp32 rows agree to float rounding).

(b) one training step (``train``): groups of (question, positive, ``--negatives`` negatives) drawn by
`dpr.rerank.data.GroupBatches` from ``<data-dir>/<data>/train.json`` (else synthetic), keeping only groups
with one positive first and nothing ignored (the peer has no ignore mask), so both sides see the same
batches. Ours: `dpr.rerank.train.train_step` with the listwise loss (our default). The peer:
``CrossEncoderTrainer.training_step`` (its ``compute_loss`` + accelerate's backward; ``accelerate`` must be
installed) with ``ListNetLoss`` on (query, [docs], labels) rows from its data collator, labels 0 for the
positive and -inf for the negatives: a one-hot softmax target, so the loss is exactly our listwise loss
(softmax cross-entropy of the positive over its group). ListNet forwards ``batch`` pairs at a time
(its default ``mini_batch_size``); ours forwards ``rerank.train.length_bucket_size`` pairs at a time sorted by length
(its default; 0 = all ``batch x (1 + N)`` at once), and the other setting runs as a lever row
(``ours-length-buckets-<n>`` or ``ours-one-forward``). Malloc tuning as ``dpr-rerank train`` sets it
(`dpr.perf.malloc`, process-wide, so the peer has it too). Then, for both, the same
clipping, AdamW (`dpr.trainkit.optim.build_optimizer`) and linear schedule; each row trains its own copy
from the same weights, steps interleaved (ours, peer, ...); per_s = pairs a step / the median step time
(the first step, which pays kernel set-up, not counted).

Rows (the JSON interface of `dpr.perf.report`, once under ``score`` and once under ``train``): ours and
``sentence-transformers`` in fp32 and bf16 (``--precision both``: bf16 only where the CPU has it natively,
``DPR_NO_BF16=1`` pretends it has not; ``--precision bf16`` runs it regardless), both sides in bf16 under
``torch.autocast``. MFU (ours): FLOPs of the padded shapes ours computes on (`dpr.perf.flops`; training 3x)
over time and the matmul peak measured here (`dpr.perf.peak`).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from script_args import OneLineParser, input_file, json_output, real, whole  # noqa: E402  (scripts/ is on sys.path)

REPO = Path(__file__).resolve().parents[1]
PEER = "sentence-transformers"
log = logging.getLogger("bench_rerank")

_WORDS = ("the of and in to was is for on as by with from at his that were an which city river war first "
          "team season album film king church school music state county north south year new national "
          "university century army party government played built named released population world "
          "american british league district island water energy species light").split()


def synthetic_examples(n: int, negatives: int, seed: int) -> list[dict]:
    """``n`` DPR retriever examples of random words (question 6-14, passages 40-160 words), ids unique."""
    rng = random.Random(seed)

    def words(lo: int, hi: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))

    def ctx(i: int, j: int) -> dict:
        return {"passage_id": f"s{i}-{j}", "title": words(1, 3), "text": words(40, 160)}

    return [{"question": words(6, 14), "answers": [], "positive_ctxs": [ctx(i, 0)], "negative_ctxs": [],
             "hard_negative_ctxs": [ctx(i, j) for j in range(1, negatives + 1)]} for i in range(n)]


def load_pairs(args, doc) -> tuple[list[str], list[str], str]:
    """``(questions, documents, source)``: the first ``--pairs`` (question, passage) pairs."""
    dev = args.data_dir / args.data / "dev.json"
    if args.results:
        from dpr.data.results import read_results

        recs, source = read_results(args.results), f"results {args.results} (top {args.k} per question)"
        pairs = [(r["question"], c) for r in recs for c in list(r["ctxs"])[:args.k]]
    else:
        if dev.is_file():
            from dpr.training.batching import load_examples

            examples, source = load_examples(dev), f"{dev} (positive + hard negatives per question)"
        else:
            examples = synthetic_examples(args.pairs // 4 + 1, 3, args.seed)
            source = f"synthetic text (no --results, no {dev})"
        pairs = [(ex["question"], c) for ex in examples for c in ex["positive_ctxs"] + ex["hard_negative_ctxs"]]
    pairs = pairs[:args.pairs]
    if not pairs:
        raise ValueError(f"{source}: no (question, passage) pair to score")
    return [q for q, _ in pairs], [doc(c.get("title") or "", c["text"]) for _, c in pairs], source


def load_groups(args, n: int) -> tuple[list, str, int]:
    """``(n groups, source, groups skipped)``: the trainer's own seeded groups, those the peer can express."""
    from dpr.rerank.data import GroupBatches, read_groups_source

    train = args.data_dir / args.data / "train.json"
    if train.is_file():
        examples, kind = read_groups_source(train)
        source = str(train)
    else:
        examples, kind = synthetic_examples(n + 1, args.negatives, args.seed), "qa"
        source = f"synthetic text (no {train})"
    batches = GroupBatches(examples, args.train_batch_size, args.negatives, args.seed, multi_positive=kind == "qrels")
    want = [True] + [False] * args.negatives
    kept, skipped = [], 0
    for step in range(4 * math.ceil(n / args.train_batch_size) + 4 * batches.steps_per_epoch):
        for g in batches.groups(step)[1]:
            if g.positive == want and not any(g.ignore):
                kept.append(g)
            else:
                skipped += 1
        if len(kept) >= n:
            return kept[:n], source, skipped
    raise ValueError(f"{source}: only {len(kept)} of {n} groups with one positive and no ignored passage")


def prepare_models(model: str, tmp: Path, max_length: int, title: bool, seed: int) -> tuple[Path, Path]:
    """``(our cross-encoder dir, its sentence-transformers export)``; a fresh one on ``model`` unless it is one."""
    from dpr.export.cross_encoder import export_cross_encoder
    from dpr.rerank.model import build_cross_encoder, is_cross_encoder_dir, resolve_dir, save_cross_encoder

    if is_cross_encoder_dir(model):
        ce_dir = resolve_dir(model)
    else:
        torch.manual_seed(seed)  # the new head's initialisation
        net, tok = build_cross_encoder(model)
        ce_dir = save_cross_encoder(net, tok, tmp / "cross_encoder", {"max_length": max_length, "title": title},
                                    extra={"base_model": model})
    return ce_dir, export_cross_encoder(ce_dir, tmp / "st_export")


def round_robin(fns: dict, rounds: int, warmup: int) -> dict:
    """``{key: (seconds of each timed round, last output)}``, rounds interleaved over the keys so load
    drift on a shared machine hits every row alike."""
    res = {key: ([], None) for key in fns}
    for r in range(warmup + rounds):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            out = fn()
            sync()
            dt = time.perf_counter() - t0
            if r >= warmup:
                res[key][0].append(dt)
            res[key] = (res[key][0], out)
            log.info("round %d %s %s %.3f s", r, *key, dt)
    return res


DEVICE = torch.device("cpu")  # --device: where both sides run (scripts/bench_gpu.py passes cuda)


def autocast(precision: str):
    return torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def sync() -> None:
    """Wait for the GPU's queued kernels, so a round's time holds its work."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


class _InputsToDevice(torch.nn.Module):
    """Our model with its inputs moved to its device (train_step collates on the CPU; same parameters)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **inputs):
        return self.model(**{k: v.to(DEVICE, non_blocking=True) for k, v in inputs.items()})


def bench_score(args, ce_dir: Path, st_dir: Path, precisions: list[str], peaks: dict) -> dict:
    from sentence_transformers import CrossEncoder

    from dpr.perf import mfu, total_flops
    from dpr.perf.report import bench_report, row
    from dpr.rerank.model import document_text, load_cross_encoder, tokenize_pairs
    from dpr.rerank.score import score_pairs
    from dpr.trainkit.precision import resolve_precision

    model, tok, settings = load_cross_encoder(ce_dir)
    model.to(DEVICE)
    questions, docs, source = load_pairs(args, lambda t, x: document_text(t, x, tok, bool(settings["title"])))
    st = CrossEncoder(str(st_dir), device=str(DEVICE), local_files_only=True)
    bs, max_len = args.batch_size, int(settings["max_length"])
    pairs = list(zip(questions, docs))

    def ours(p: str):
        return lambda: score_pairs(model, tok, questions, docs, batch_size=bs, autocast=p, max_length=max_len).numpy()

    def theirs(p: str):
        def run():
            with autocast(p):
                return np.asarray(st.predict(pairs, batch_size=bs, show_progress_bar=False), dtype=np.float32)
        return run

    fns = {}
    for p in precisions:
        fns[("ours", p)], fns[(PEER, p)] = ours(p), theirs(p)
    timed = round_robin(fns, args.repeats, args.warmup)
    # the padded shapes score_pairs computes on: its longest-first sort, batches of bs
    lengths = sorted((len(x) for x in tokenize_pairs(tok, questions, docs, max_len, padding=False)["input_ids"]),
                     reverse=True)
    shapes = [(len(lengths[i:i + bs]), lengths[i]) for i in range(0, len(lengths), bs)]
    flops = total_flops(model.config, shapes)
    ref = timed[("ours", "fp32")][1] if ("ours", "fp32") in timed else None
    rows = []
    for (system, p), (times, scores) in timed.items():
        secs = statistics.median(times)
        diff = None if ref is None else round(float(np.abs(scores - ref).max()), 7)
        rows.append(row(system, p, len(pairs) / secs, mfu(flops, secs, peaks.get(p)) if system == "ours" else None,
                        median_s=round(secs, 4), times_s=[round(t, 4) for t in times],
                        max_abs_diff_vs_ours_fp32=diff))
    return bench_report(rows, PEER, resolve_precision("auto"), peaks, unit="pairs/s", pairs=len(pairs),
                        questions=len(set(questions)), source=source, batch_size=bs, max_length=max_len,
                        repeats=args.repeats, warmup=args.warmup, padded_tokens=sum(b * s for b, s in shapes),
                        gflop=round(flops / 1e9, 3), peer_call="CrossEncoder.predict")


def _peer_trainer(st_dir: Path, args, tmp: Path):
    """A ``CrossEncoderTrainer`` with ``ListNetLoss`` on its own copy of the export (none of its loop runs)."""
    try:
        import accelerate  # noqa: F401  (CrossEncoderTrainer refuses to build without it)
    except ImportError as err:
        raise ImportError(f"the training bench's peer is CrossEncoderTrainer, which needs accelerate "
                          f"(pip install accelerate; or --no-train): {err}") from None
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import ListNetLoss

    ce = CrossEncoder(str(st_dir), device=str(DEVICE), local_files_only=True)
    targs = CrossEncoderTrainingArguments(
        output_dir=str(tmp / "st_trainer"), per_device_train_batch_size=args.train_batch_size,
        learning_rate=args.lr, weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
        report_to="none", use_cpu=DEVICE.type == "cpu", seed=args.seed, save_strategy="no", disable_tqdm=True)
    trainer = CrossEncoderTrainer(model=ce, args=targs, loss=ListNetLoss(ce))
    trainer.current_gradient_accumulation_steps = 1  # what its loop sets with gradient_accumulation_steps=1
    return ce, trainer


def bench_train(args, ce_dir: Path, st_dir: Path, precisions: list[str], peaks: dict, tmp: Path) -> dict:
    from dpr.perf import mfu, total_flops
    from dpr.perf.malloc import keep_freed_memory
    from dpr.perf.report import bench_report, row
    from dpr.rerank.config import RerankTrainConfig
    from dpr.rerank.data import collate
    from dpr.rerank.losses import LOSSES
    from dpr.rerank.model import document_text, load_cross_encoder
    from dpr.rerank.train import StepRecipe, train_step
    from dpr.trainkit.optim import build_optimizer, linear_schedule, resolve_warmup
    from dpr.trainkit.precision import autocast_context, resolve_precision

    # what `dpr-rerank train` sets first (process-wide: the peer's steps get it too, which only helps the peer)
    malloc_tuned = keep_freed_memory()
    steps, bs = args.steps, args.train_batch_size
    groups, source, skipped = load_groups(args, steps * bs)
    batches = [groups[i * bs:(i + 1) * bs] for i in range(steps)]
    _, tok, settings = load_cross_encoder(ce_dir)
    max_len, title = int(settings["max_length"]), bool(settings["title"])
    warmup = resolve_warmup(0, args.warmup_ratio, steps)

    def schedule(net):
        opt = build_optimizer(net, args.lr, args.weight_decay)
        return opt, linear_schedule(opt, warmup, steps)

    def make_ours(p: str, length_bucket_size: int):
        model = load_cross_encoder(ce_dir)[0].to(DEVICE).train()
        opt, sched = schedule(model)
        ctx = autocast_context(DEVICE, p)
        net = _InputsToDevice(model) if DEVICE.type == "cuda" else model
        recipe = StepRecipe(LOSSES["listwise"], ctx, max_len, title, args.max_grad_norm, length_bucket_size)
        return lambda b: train_step(net, tok, b, opt, sched, recipe)["loss"]

    def make_peer(p: str):
        ce, trainer = _peer_trainer(st_dir, args, tmp)
        opt, sched = schedule(ce)
        n = args.negatives

        def step(b) -> float:
            rows = [{"query": g.question, "docs": [document_text(c["title"], c["text"], tok, title) for c in g.passages],
                     "label": [0.0] + [-math.inf] * n} for g in b]
            with autocast(p):
                loss = trainer.training_step(ce, trainer.data_collator(rows))
            torch.nn.utils.clip_grad_norm_(ce.parameters(), args.max_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            return float(loss)
        return step

    # ours = `dpr-rerank train`'s step: its length_bucket_size default; the other setting is the lever row
    default_buckets = RerankTrainConfig().length_bucket_size
    lever_buckets = args.length_bucket_lever
    if lever_buckets is None:  # the other side of the default: one forward where it buckets, buckets of 8 if not
        lever_buckets = 0 if default_buckets else 8
    lever = f"length-buckets-{lever_buckets}" if lever_buckets else "one-forward"
    sides, buckets_of = {}, {"ours": default_buckets, f"ours-{lever}": lever_buckets}
    for p in precisions:
        sides[("ours", p)], sides[(PEER, p)] = make_ours(p, default_buckets), make_peer(p)
        if lever_buckets != default_buckets:
            sides[(f"ours-{lever}", p)] = make_ours(p, lever_buckets)
    if args.threads > 0:  # building a trainer must not have changed it
        torch.set_num_threads(args.threads)
    res = {key: {"times": [], "losses": []} for key in sides}
    for i, b in enumerate(batches):
        for key, step in sides.items():
            t0 = time.perf_counter()
            res[key]["losses"].append(step(b))
            sync()
            res[key]["times"].append(time.perf_counter() - t0)
        log.info("step %d/%d: %s", i + 1, steps, " | ".join(
            f"{k[0]} {k[1]} {v['times'][-1]:.2f}s loss {v['losses'][-1]:.4f}" for k, v in res.items()))
    shapes = [tuple(collate(b, tok, max_len, title)["input_ids"].shape) for b in batches]
    pairs_per_step = bs * (1 + args.negatives)
    timed = slice(1, None)  # the first step pays kernel set-up (--steps >= 2: checked with the arguments)
    config = load_cross_encoder(ce_dir)[0].config
    rows = []
    for (system, p), side in res.items():
        secs = statistics.median(side["times"][timed])
        flops = statistics.median(total_flops(config, [s], training=True) for s in shapes[timed])
        ours_losses = res[("ours", p)]["losses"]
        levers = ([f"rerank.train.precision={p}", f"rerank.train.length_bucket_size={buckets_of[system]}"]
                  if system in buckets_of else ["torch.autocast(bfloat16)"] if p == "bf16" else [])
        rows.append(row(system, p, pairs_per_step / secs,
                        mfu(flops, secs, peaks.get(p)) if system.startswith("ours") else None, levers=levers,
                        median_step_s=round(secs, 4), times_s=[round(t, 4) for t in side["times"]],
                        first_loss=round(side["losses"][0], 6), last_loss=round(side["losses"][-1], 6),
                        mean_loss=round(statistics.fmean(side["losses"]), 6),
                        max_abs_loss_diff_vs_ours=round(max(abs(a - b) for a, b in zip(side["losses"], ours_losses)), 7)))
    return bench_report(rows, PEER, resolve_precision("auto"), peaks, unit="pairs/s", steps=steps,
                        malloc_tuning=malloc_tuned,
                        batch_size=bs, negatives=args.negatives, pairs_per_step=pairs_per_step, source=source,
                        groups_skipped=skipped, max_length=max_len, loss="listwise",
                        peer_call="CrossEncoderTrainer.training_step + ListNetLoss (one-hot target)",
                        padded_shapes=[list(s) for s in shapes])


def main(argv: list[str] | None = None) -> dict:
    from dpr.rerank.config import RerankConfig

    d = RerankConfig()
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=d.model.name, help="base encoder (alias, HF dir) or a trained cross-encoder dir")
    ap.add_argument("--results", type=input_file, help="a DPR results file: pairs from each question's top --k ctxs")
    ap.add_argument("--k", type=whole(1), default=d.score.k)
    ap.add_argument("--data-dir", type=Path, default=REPO / "data" / "prepared")
    ap.add_argument("--data", default="squad1_open", help="dev.json: pairs without --results; train.json: groups")
    ap.add_argument("--pairs", type=whole(1), default=1000, help="pairs to score per round")
    ap.add_argument("--batch-size", type=whole(1), default=d.score.batch_size, help="scoring batch (both sides)")
    ap.add_argument("--repeats", type=whole(1), default=5, help="timed scoring rounds (median kept)")
    ap.add_argument("--warmup", type=whole(0), default=1, help="untimed scoring rounds first")
    ap.add_argument("--precision", choices=("fp32", "bf16", "both"), default="both")
    ap.add_argument("--threads", type=whole(0), default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--max-length", type=whole(1), default=d.max_length, help="for a fresh model (a trained one keeps its own)")
    ap.add_argument("--steps", type=whole(2), default=10, help="training steps per row (the first is not timed)")
    ap.add_argument("--length-bucket-lever", type=whole(0), default=None,
                    help="the lever row's rerank.train.length_bucket_size (default: 0, one forward, where the "
                         "default buckets; 8 where it is one forward)")
    ap.add_argument("--train-batch-size", type=whole(1), default=d.train.batch_size, help="questions per training step")
    ap.add_argument("--negatives", type=whole(1), default=d.train.negatives)
    ap.add_argument("--lr", type=real(0, lo_open=True), default=d.train.lr)
    ap.add_argument("--weight-decay", type=real(0), default=d.train.weight_decay)
    ap.add_argument("--warmup-ratio", type=real(0, 1), default=d.train.warmup_ratio)
    ap.add_argument("--max-grad-norm", type=real(0), default=d.train.max_grad_norm)
    ap.add_argument("--no-score", action="store_true")
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--peak-n", type=whole(1), default=2048, help="matmul size for the measured peak")
    ap.add_argument("--seed", type=whole(0), default=d.train.seed)
    ap.add_argument("--json", type=json_output, help="also write the results here")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N: both sides run there (scripts/bench_gpu.py)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from dpr.atomic import write_json_atomic
    from dpr.perf import cpu_flags, cpu_supports_bf16, matmul_peak_gflops
    from dpr.perf.cpu import cpu_has_native_bf16
    from dpr.perf.report import format_table

    global DEVICE
    DEVICE = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    skipped = {}
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    bf16 = torch.cuda.is_bf16_supported() if DEVICE.type == "cuda" else cpu_supports_bf16()
    if args.precision == "both" and not bf16:
        precisions, skipped["bf16"] = ["fp32"], "no native bf16 on this device (or DPR_NO_BF16=1); --precision bf16 forces it"
    peaks = {p: matmul_peak_gflops(p, args.peak_n, device=DEVICE) for p in precisions}
    report: dict = {"model": args.model, "precisions": precisions, "threads": torch.get_num_threads(), "device": str(DEVICE),
                    "bf16_native": cpu_has_native_bf16(), "cpu_flags": list(cpu_flags()),
                    "versions": {"torch": torch.__version__, **_versions()}}
    if skipped:
        report["skipped"] = skipped
    with tempfile.TemporaryDirectory(prefix="bench_rerank_") as tmp:
        ce_dir, st_dir = prepare_models(args.model, Path(tmp), args.max_length, True, args.seed)
        if not args.no_score:
            report["score"] = bench_score(args, ce_dir, st_dir, precisions, peaks)
        if not args.no_train:
            report["train"] = bench_train(args, ce_dir, st_dir, precisions, peaks, Path(tmp))
    report["threads_after"] = torch.get_num_threads()
    for part, cols in (("score", [("pairs/s", "per_s", ".1f"), ("MFU", "mfu", ""), ("median s", "median_s", ".3f"),
                                  ("max |d| fp32", "max_abs_diff_vs_ours_fp32", ".2e")]),
                       ("train", [("pairs/s", "per_s", ".1f"), ("MFU", "mfu", ""),
                                  ("median s/step", "median_step_s", ".3f"), ("mean loss", "mean_loss", ".4f")])):
        if part in report:
            print(f"\n{part}:\n" + format_table(report[part], cols))
    if args.json:
        write_json_atomic(args.json, report, indent=1)
    return report


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("transformers", "sentence-transformers", "accelerate"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


if __name__ == "__main__":
    main()
