#!/usr/bin/env python
"""Where the time goes: ``torch.profiler`` (CPU activities) of dpr-train's default step and of dpr-encode's encoding.

- train: the ``ours`` step of ``scripts/bench_train.py`` (exactly ``dpr-train``'s default two-tower step:
  length-sorted buckets of ``train.length_bucket_size``, ``train.optimizer_impl``'s AdamW, the divergence
  check, glibc malloc tuned as ``dpr-train`` tunes it), ``--warmup`` steps first (not profiled: kernel set-up,
  allocator growth), then ``--steps`` profiled; ``--attention-dropout P``: that step with ``train.attention_dropout=P``
  (e.g. 0: no attention-dropout masks);
- encode: ``--passages`` passages with their titles through ``dpr-encode``'s torch path
  (`dpr.models.encode_texts`: its length sort, batches of ``--batch-size`` padded to their longest, inference
  mode, ``weights=auto`` = fp32 weights under autocast), one pass not profiled first. Where ``runtime=auto``
  would pick ONNX Runtime (fp32 on an AVX-512 CPU) the settings say so: its kernels are outside torch.profiler.

Each in fp32 and in bf16 autocast where `dpr.perf.cpu` says the CPU has native bf16 (``--precision``: auto
(that rule), fp32, bf16 (bf16 only, forced even where emulated), both). Per profile: the top ``--top``
operators by self CPU time (name, self_ms, share = % of all operators' self time, calls), the profiled wall
time and the share of it spent inside operators (the rest: Python, the tokenizer, the data). The JSON
(``--json``) also holds the CPU flags and the settings; the markdown tables are printed (``--md PATH``:
written there too).

    .venv/bin/python scripts/profile_step.py --json profile.json --md profile.md     # MiniLM, squad1_open
    .venv/bin/python scripts/profile_step.py --tiny --json /tmp/p.json                # a tiny random BERT (tests)
"""

from __future__ import annotations

import itertools
import math
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from bench_train import REPO, dataset, ours_step  # noqa: E402  (scripts/ is on sys.path when run as a script)
from script_args import OneLineParser, json_output, output_file, real, refuse, whole  # noqa: E402  (scripts/ is on sys.path)

PRECISIONS = ("auto", "fp32", "bf16", "both")


def tiny_bert(out: Path) -> Path:
    """A randomly initialised 2-layer BERT with MiniLM's tokenizer (the tests' tiny model), saved in HF format."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from dpr.models.hub import default_model_path

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(default_model_path())
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=256)
    BertModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def precisions_for(choice: str) -> list[str]:
    """The precisions to profile: fp32, plus bf16 where `dpr.perf.cpu` says the CPU has it (auto)."""
    from dpr.perf.cpu import cpu_supports_bf16

    if choice not in PRECISIONS:
        refuse(f"profile_step: --precision must be one of {PRECISIONS}, got {choice!r}")
    return {"auto": ["fp32"] + (["bf16"] if cpu_supports_bf16() else []), "fp32": ["fp32"], "bf16": ["bf16"],
            "both": ["fp32", "bf16"]}[choice]


def top_operators(prof, top: int) -> tuple[list[dict], float]:
    """The ``top`` operators by self CPU time and the total self time (ms) of all of them; shares are rounded
    down, so they never sum past 100."""
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total_us = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    ops = [{"name": e.key, "self_ms": round(e.self_cpu_time_total / 1e3, 3),
            "share": math.floor(10_000 * e.self_cpu_time_total / total_us) / 100 if total_us else 0.0,
            "calls": int(e.count)} for e in events[:top]]
    return ops, total_us / 1e3


def profile(what: str, precision: str, fn, runs: int, top: int) -> dict:
    """``fn`` profiled ``runs`` times (CPU activities), after the caller's warm-up."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(runs):
            fn()
        wall_ms = (time.perf_counter() - t0) * 1e3
    ops, total_ms = top_operators(prof, top)
    return {"what": what, "precision": precision, "runs": runs, "wall_ms": round(wall_ms, 1),
            "ops_self_ms": round(total_ms, 1), "ops_share_of_wall": round(100 * total_ms / wall_ms, 1) if wall_ms else None,
            "ops": ops}


def markdown(report: dict) -> str:
    """One table per profile: operator, self ms, share of all operators' self time, calls."""
    s = report["settings"]
    lines = [f"CPU: {report['cpu']}; model {s['model']}; {s['threads']} threads", ""]
    for p in report["profiles"]:
        head = (f"**{p['what']} {p['precision']}** ({p['runs']} x {p['unit']}, {p['wall_ms']:.0f} ms wall, "
                f"{p['ops_share_of_wall']}% of it in operators)")
        lines += [head, "", "| operator | self ms | share | calls |", "|---|---:|---:|---:|"]
        lines += [f"| `{o['name']}` | {o['self_ms']:.1f} | {o['share']:.1f}% | {o['calls']} |" for o in p["ops"]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    from dpr.perf.malloc import keep_freed_memory

    malloc_tuned = keep_freed_memory()  # as dpr-train does first thing (dpr/perf/malloc.py)
    from dpr.training.config import TrainConfig

    defaults = TrainConfig()
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="all-MiniLM-L6-v2", help="alias or HF model dir")
    ap.add_argument("--tiny", action="store_true", help="a tiny random BERT and the tests' tiny set (tests)")
    ap.add_argument("--data-dir", type=Path, default=REPO / "data" / "prepared")
    ap.add_argument("--data", default="squad1_open")
    ap.add_argument("--precision", default="auto", help=f"one of {PRECISIONS} (module doc)")
    ap.add_argument("--batch-size", type=whole(1), default=None,
                    help=f"training questions per step (default: train.batch_size, {defaults.batch_size}; --tiny: 4)")
    ap.add_argument("--hard-negatives", type=whole(0), default=defaults.hard_negatives)
    ap.add_argument("--question-max-length", type=whole(1), default=64)
    ap.add_argument("--passage-max-length", type=whole(1), default=192)
    ap.add_argument("--warmup", type=whole(0), default=1, help="training steps (and encode passes) not profiled")
    ap.add_argument("--steps", type=whole(1), default=1, help="training steps profiled")
    ap.add_argument("--passages", type=whole(1), default=256, help="passages encoded per profiled pass")
    ap.add_argument("--encode-batch-size", type=whole(1), default=64, help="dpr-encode's batch_size")
    ap.add_argument("--top", type=whole(1), default=15, help="operators listed per profile")
    ap.add_argument("--threads", type=whole(0), default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--attention-dropout", type=real(0, 1), default=defaults.attention_dropout,
                    help="train.attention_dropout for the training step (default: null, the model's own)")
    ap.add_argument("--seed", type=whole(0), default=42)
    ap.add_argument("--json", type=json_output, default=None)
    ap.add_argument("--md", type=output_file, default=None, help="also write the markdown tables here")
    args = ap.parse_args(argv)

    from dpr.atomic import write_json_atomic
    from dpr.data.passages import iter_passages
    from dpr.models import encode_texts, load_biencoder
    from dpr.models.onnx_runtime import resolve_runtime
    from dpr.perf.cpu import cpu_flags, cpu_has_avx512, cpu_has_native_bf16, cpu_supports_bf16
    from dpr.training.batching import TrainBatches, load_examples
    from dpr.trainkit.optim import resolve_optimizer_impl

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="profile_step_"))
    model_name = str(tiny_bert(tmp / "tiny_bert")) if args.tiny else args.model
    train_path, data_desc = dataset(tmp if args.tiny else args.data_dir, "tiny" if args.tiny else args.data)
    examples = load_examples(train_path)
    batch_size = min(args.batch_size or (4 if args.tiny else defaults.batch_size), len(examples))
    precisions = precisions_for(args.precision)
    model_kw = dict(shared=True, pooling="mean", similarity="cosine", temperature=0.05,
                    question_max_length=args.question_max_length, passage_max_length=args.passage_max_length)
    model, tok = load_biencoder(model_name, **model_kw)
    batches = TrainBatches(examples, tok, TrainConfig(batch_size=batch_size, hard_negatives=args.hard_negatives),
                           model.config, seed=args.seed, mask_answers=False)
    per_epoch = batches.num_batches(0)
    rows = list(itertools.islice(iter_passages(train_path.parent / "passages.tsv"), args.passages))
    texts, titles = [r["text"] for r in rows], [r.get("title") or "" for r in rows]

    profiles = []
    for p in precisions:
        step = ours_step(model_name, model_kw, batches, p, steps=args.warmup + args.steps, lr=defaults.lr,
                         max_grad_norm=defaults.max_grad_norm, bucket_size=defaults.bucket_size_for("cpu"),
                         impl=defaults.optimizer_impl, seed=args.seed, attention_dropout=args.attention_dropout)
        plan = iter(itertools.cycle([(i // per_epoch, i % per_epoch) for i in range(args.warmup + args.steps)]))
        for _ in range(args.warmup):
            step(*next(plan))
        profiles.append({**profile("train", p, lambda: step(*next(plan)), args.steps, args.top), "unit": "step"})

        def encode(p=p):
            encode_texts(model, tok, texts, "passage", batch_size=args.encode_batch_size,
                         autocast="bf16" if p == "bf16" else "off", titles=titles)
        for _ in range(max(1, args.warmup)):
            encode()
        profiles.append({**profile("encode", p, encode, 1, args.top), "unit": f"{len(texts)} passages"})
        print(f"profiled {p}", flush=True)

    report = {
        "cpu_flags": list(cpu_flags()),
        "cpu": {"native_bf16": cpu_has_native_bf16(), "bf16_rule": cpu_supports_bf16(), "avx512": cpu_has_avx512()},
        "settings": {"model": model_name, "data": data_desc, "threads": torch.get_num_threads(),
                     "precisions": precisions, "train_batch_size": batch_size, "hard_negatives": args.hard_negatives,
                     "question_max_length": args.question_max_length, "passage_max_length": args.passage_max_length,
                     "length_bucket_size": defaults.bucket_size_for("cpu"),
                     "optimizer_impl": resolve_optimizer_impl(defaults.optimizer_impl), "malloc_tuned": malloc_tuned,
                     "attention_dropout": args.attention_dropout,
                     "towers": "shared", "warmup": args.warmup, "steps": args.steps, "passages": len(texts),
                     "encode_batch_size": args.encode_batch_size, "encode_runtime": "torch",
                     "encode_runtime_auto_fp32": resolve_runtime("auto", "cpu", "off")},
        "profiles": profiles,
    }
    md = markdown(report)
    print(md)
    if args.md:
        args.md.write_text(md + "\n", encoding="utf-8")
    if args.json:
        write_json_atomic(args.json, report)
    return report


if __name__ == "__main__":
    main()
