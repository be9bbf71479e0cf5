#!/usr/bin/env python
"""Passage encoding speed: the project's encoder against sentence-transformers, precision for precision.

    .venv/bin/python scripts/bench_encode.py --json bench_encode.json                 # 512 squad1_open passages
    .venv/bin/python scripts/bench_encode.py --n 1024 --qa 300 --json bench_encode.json
    .venv/bin/python scripts/bench_encode.py --no-bf16 --json nobf16.json             # as on a CPU without bf16

Model: all-MiniLM-L6-v2 (offline copy) or ``--model <HF dir>``. Texts: the first ``--n`` passages of
squad1_open with their titles, as ``dpr-encode`` encodes them: ours the (title, text) pairs, the peer
``"title [SEP] text"`` (the same tokens). Rows, timed round-robin (best of ``--repeat``) so load from other
jobs drifts over all of them alike:

- fp32: ours (`dpr.models.encode_texts`: ``dpr-encode``'s path, `dpr.models.iter_encode_batches`: tokenized once,
  sorted by token count, batches padded to their longest, inference mode, ``weights=auto`` = fp32
  weights) and sentence-transformers ``encode`` (its default; it sorts by characters);
- bf16 (only where the CPU has native bf16; ``--no-bf16`` / ``DPR_NO_BF16=1`` pretends it has not):
  both under ``torch.autocast(bfloat16)``;
- int8: ours with dynamic int8 ``nn.Linear`` (`dpr.models.quantize`); the peer has no torch int8 path;
- levers in fp32, system ``ours-onnx``: our passage tower in ONNX Runtime (`dpr.models.onnx_runtime`,
  ``encode.runtime=onnx``; questions stay torch, as at retrieve time), and ``sentence-transformers-onnx``:
  its ``backend="onnx"`` (needs ``optimum``; skipped, with the reason in ``skipped``, where it is missing);
- ``ours-bf16-weights`` (where the bf16 rows run): the encoder's weights cast to bf16 once, no autocast
  (`dpr.models.weights`, ``encode.weights=bf16``), with its min cosine against our bf16 autocast vectors too
  (``cosine_min_vs_ours_bf16``: the lever's quality bar is >= 0.99 there and an unchanged top-20);
- ``ours-char-sort`` (in our default torch precision): our torch path batching by characters
  (``encode.length_sort=chars``, the rule before token sorting and sentence-transformers' own), so the
  ``ours`` row's gain from batching by token count shows on its own;
- ``ours-compiled`` (in our default torch precision; ``--no-compile`` skips it, and so does a platform where
  torch.compile cannot compile, reason in ``skipped``): the passage tower through
  ``torch.compile(dynamic=True)`` (`dpr.models.compile`, ``encode.compile=true``); its first pass (the compile)
  is timed apart, ``first_pass_s`` and ``compile_s`` (first pass minus the best timed pass), with
  ``cosine_min_vs_eager`` against our vectors in that precision (the bar: >= 0.9999).

Every row lists the config keys it sets in ``levers`` (empty: the defaults of its system in that precision).

MFU (ours): FLOPs from the model config (`dpr.perf.flops`) over the padded batch shapes our encoder
actually computes on, divided by time and by the matmul peak this script measures in that precision
(`dpr.perf.peak`, ``--peak-n``); ``ours-onnx`` over the same shapes (it may pass 100%: the peak is torch's
matmul); none for int8 (no comparable peak). Quality per row: min cosine
against our fp32 vectors, and with ``--qa M`` top-20 accuracy on M questions whose answer occurs in the
N passages. ``ratio.best``: ours with this machine's defaults (autocast, quantize and runtime ``auto``: the
``ours-onnx`` row where the encode runs in fp32 on an AVX-512 CPU, else ``ours``) over the peer's default (fp32); ``ratio_levers``: each ``ours-<lever>`` row over the peer's default
and over the peer's same lever. Also timed: `dpr.encode.encode_corpus` end to end (TSV → Arrow → shards).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_data import find_dataset  # noqa: E402  (scripts/ is on sys.path when run as a script)
from script_args import OneLineParser, json_output, whole  # noqa: E402  (scripts/ is on sys.path)

log = logging.getLogger("bench_encode")


# The config keys each row sets (its levers); rows not listed set none.
LEVERS = {("ours", "fp32"): ["encode.autocast=off"], ("ours", "bf16"): ["encode.autocast=bf16"],
          ("ours", "int8"): ["encode.quantize=int8"], ("ours-onnx", "fp32"): ["encode.runtime=onnx"],
          ("ours-bf16-weights", "bf16"): ["encode.weights=bf16"],
          ("ours-compiled", "fp32"): ["encode.autocast=off", "encode.compile=true"],
          ("ours-compiled", "bf16"): ["encode.autocast=bf16", "encode.compile=true"],
          ("ours-char-sort", "fp32"): ["encode.autocast=off", "encode.length_sort=chars"],
          ("ours-char-sort", "bf16"): ["encode.autocast=bf16", "encode.length_sort=chars"],
          ("sentence-transformers", "bf16"): ["torch.autocast(bfloat16)"],
          ("sentence-transformers-onnx", "fp32"): ['backend="onnx"']}


def best_times(fns: dict, repeat: int, clock=time.perf_counter) -> dict[str, tuple[float, object]]:
    """Best wall time of each function over ``repeat`` rounds, run round-robin so that load from other
    processes drifts over all of them alike (the first round also pays one-off costs such as oneDNN
    building a kernel for each new batch shape)."""
    best: dict[str, tuple[float, object]] = {name: (float("inf"), None) for name in fns}
    for r in range(repeat):
        for name, fn in fns.items():
            t0 = clock()
            out = fn()
            dt = clock() - t0
            log.info("round %d %-5s %.1f psg/s", r, name, 0 if dt == 0 else len(out) / dt)
            if dt < best[name][0]:
                best[name] = (dt, out)
    return best


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def top_k_accuracy(q: np.ndarray, p: np.ndarray, hits: np.ndarray, k: int) -> float:
    """Fraction of questions with an answer-bearing passage among the k most similar (cosine)."""
    top = np.argsort(-(unit(q) @ unit(p).T), axis=1, kind="stable")[:, :k]
    return float(np.take_along_axis(hits, top, axis=1).any(axis=1).mean())


def onnx_levers(model, tok, path: str, skipped: dict, cache_dir: Path | None = None) -> tuple:
    """(our passage tower in ONNX Runtime, sentence-transformers with ``backend="onnx"``); None for each one
    that cannot run here, with the reason in ``skipped``."""
    ours = theirs = None
    try:
        from dpr.index.fingerprint import model_fingerprint
        from dpr.models.onnx_runtime import onnx_tower

        ours = onnx_tower(model, tok, "passage", model_fingerprint(path), cache_dir=cache_dir)
    except ValueError as err:  # onnxruntime or onnx missing, or the export failed its check
        skipped["ours-onnx"] = str(err)
    try:
        import optimum.onnxruntime  # noqa: F401  (sentence-transformers' ONNX backend runs on it)
        from sentence_transformers import SentenceTransformer

        import onnxruntime as ort
        import torch

        opts = ort.SessionOptions()  # the same thread count as every other row
        opts.intra_op_num_threads = torch.get_num_threads()
        theirs = SentenceTransformer(path, device="cpu", backend="onnx", model_kwargs={"session_options": opts})
    except Exception as err:  # noqa: BLE001 - optional peer lever: any failure skips the row, reason kept
        skipped["sentence-transformers-onnx"] = f"{type(err).__name__}: {err}"[:300]
    for name, reason in skipped.items():
        log.info("skipped %s: %s", name, reason)
    return ours, theirs


def compiled_lever(model, ours, precision: str, skipped: dict) -> dict | None:
    """The ``encode.compile=true`` row: a copy of the model with its passage tower compiled, run once untimed
    (the compile: ``first_pass_s``); None, with the reason in ``skipped``, where torch.compile cannot compile."""
    import copy

    from dpr.models.compile import compile_tower, compile_unavailable

    why = compile_unavailable("cpu")
    if why is not None:
        skipped["ours-compiled"] = why
        log.info("skipped ours-compiled: %s", why)
        return None
    fn = ours("bf16" if precision == "bf16" else "off", compile_tower(copy.deepcopy(model), "passage"))
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    log.info("ours-compiled: first pass (compile included) %.1f s", first)
    return {"fn": fn, "first_pass_s": first}


def main(argv: list[str] | None = None) -> dict:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=whole(1), default=512, help="passages to encode")
    ap.add_argument("--batch-size", type=whole(1), default=64)
    ap.add_argument("--repeat", type=whole(1), default=3, help="timed rounds per encoder (best is kept)")
    ap.add_argument("--autocast", default="auto", help="our default precision: auto | bf16 | off")
    ap.add_argument("--qa", type=whole(0), default=0, help="questions for the top-20 accuracy check (0 = skip)")
    ap.add_argument("--data-dir", type=Path, default=REPO / "data" / "prepared")
    ap.add_argument("--dataset", default="squad1_open")
    ap.add_argument("--model", default="all-MiniLM-L6-v2", help="alias or HF model dir (tests: a tiny BERT)")
    ap.add_argument("--no-bf16", action="store_true", help="pretend the CPU lacks native bf16 (DPR_NO_BF16=1)")
    ap.add_argument("--no-int8", action="store_true", help="skip our int8 row")
    ap.add_argument("--no-onnx", action="store_true", help="skip the ONNX Runtime rows (ours and the peer's)")
    ap.add_argument("--onnx-cache", type=Path, help="where our exported graph is cached (default: the data cache)")
    ap.add_argument("--no-corpus", action="store_true", help="skip the encode_corpus end-to-end timing")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile row (ours-compiled)")
    ap.add_argument("--peak-n", type=whole(1), default=2048, help="matmul size for the measured peak")
    ap.add_argument("--threads", type=whole(0), default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: process CPU time, steadier than wall time on a machine shared with other jobs "
                         "(use with --threads 1)")
    ap.add_argument("--json", type=json_output, help="also write the results here (the interface in dpr/perf/report.py)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N: both encoders run there (scripts/bench_gpu.py); "
                    "on a GPU the int8, ONNX and compiled rows and the encode_corpus timing are skipped")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.no_bf16:
        os.environ["DPR_NO_BF16"] = "1"

    import torch
    from sentence_transformers import SentenceTransformer

    from dpr.atomic import write_json_atomic
    from dpr.data.passages import iter_passages, write_passages
    from dpr.encode import encode_corpus
    from dpr.encode_config import EncodeConfig
    from dpr.models import encode_texts, load_biencoder
    from dpr.models.hub import resolve_model_name
    from dpr.models.inference import padded_batches
    from dpr.models.onnx_runtime import resolve_runtime
    from dpr.models.quantize import quantize_for_inference
    from dpr.models.weights import cast_weights
    from dpr.perf import cpu_supports_bf16, matmul_peak_gflops, mfu, total_flops
    from dpr.perf.report import bench_report, format_table, row

    if args.threads:
        torch.set_num_threads(args.threads)
    root = find_dataset(args.data_dir, args.dataset, prefix="bench_encode_")
    rows = list(itertools.islice(iter_passages(root / "passages.tsv"), args.n))
    texts = [r["text"] for r in rows]
    titles = [r.get("title") or "" for r in rows]  # dpr-encode encodes (title, text) pairs
    peer_texts = [f"{ti} [SEP] {te}" if ti else te for ti, te in zip(titles, texts)]  # the same tokens
    path = resolve_model_name(args.model)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    if on_gpu:  # CPU levers (dynamic int8, ONNX Runtime's CPU kernels) and encode_corpus's own device: not here
        args.no_int8 = args.no_onnx = args.no_compile = args.no_corpus = True
    model, tok = load_biencoder(args.model, pooling="mean")  # sentence-transformers mean-pools a plain HF dir too
    model.to(device)
    st = SentenceTransformer(path, device=str(device))
    bs = args.batch_size
    bf16 = torch.cuda.is_bf16_supported() if on_gpu else cpu_supports_bf16()
    precisions = ["fp32"] + (["bf16"] if bf16 else [])
    peer = "sentence-transformers"

    def ours(autocast: str, m=model, length_sort: str = "tokens"):
        return lambda: encode_texts(m, tok, texts, "passage", batch_size=bs, autocast=autocast,
                                    titles=titles, length_sort=length_sort, device=device).numpy()

    def theirs(precision: str):
        def run():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                return st.encode(peer_texts, batch_size=bs, convert_to_numpy=True, show_progress_bar=False)
        return run

    fns, skipped = {}, {}
    for p in precisions:
        fns[("ours", p)] = ours("off" if p == "fp32" else "bf16")
        fns[(peer, p)] = theirs(p)
    bf16_model = None
    if bf16:  # the bf16-weights lever: one cast, then no autocast (every op in bf16)
        import copy

        bf16_model = cast_weights(copy.deepcopy(model), "bf16")
        fns[("ours-bf16-weights", "bf16")] = ours("off", bf16_model)
    int8_model = None
    if not args.no_int8:
        int8_model = quantize_for_inference(model, "int8")
        fns[("ours", "int8")] = ours("off", int8_model)
    if not args.no_onnx:
        onnx_runner, st_onnx = onnx_levers(model, tok, path, skipped, args.onnx_cache)
        if onnx_runner is not None:
            fns[("ours-onnx", "fp32")] = lambda: encode_texts(model, tok, texts, "passage", batch_size=bs,
                                                              titles=titles, runner=onnx_runner).numpy()
        if st_onnx is not None:
            fns[(f"{peer}-onnx", "fp32")] = lambda: st_onnx.encode(peer_texts, batch_size=bs, convert_to_numpy=True,
                                                                   show_progress_bar=False)
    torch_default = "bf16" if bf16 and args.autocast in ("auto", "bf16") else "fp32"  # autocast auto's precision
    compiled = None if args.no_compile else compiled_lever(model, ours, torch_default, skipped)
    if compiled is not None:
        fns[("ours-compiled", torch_default)] = compiled["fn"]
    # The batching before token sorting (and sentence-transformers' own): by characters.
    fns[("ours-char-sort", torch_default)] = ours("bf16" if torch_default == "bf16" else "off", length_sort="chars")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    timed = best_times(fns, args.repeat, clock)
    peaks = {p: matmul_peak_gflops(p, args.peak_n, device=device) for p in precisions}

    # The shapes our encoder computes on: its own batches (by token count; the char-sort row's by characters),
    # each padded to its longest.
    padded = {sort: [batch["attention_mask"] for _, batch in padded_batches(
        tok, texts, titles, bs, model.config.passage_max_length, model.config.prefix("passage"), sort)]
        for sort in ("tokens", "chars")}
    shapes, char_shapes = ([tuple(mask.shape) for mask in padded[sort]] for sort in ("tokens", "chars"))
    real_tokens = int(sum(int(mask.sum()) for mask in padded["tokens"]))
    flops = total_flops(model.question_encoder.config, shapes)
    char_flops = total_flops(model.question_encoder.config, char_shapes)
    ref = timed[("ours", "fp32")][1]
    n = len(texts)
    out_rows = []
    for (system, p), (secs, vecs) in timed.items():
        cos = (unit(vecs) * unit(ref)).sum(1)
        row_flops = char_flops if system == "ours-char-sort" else flops  # each row's own padded shapes
        m = mfu(row_flops, secs, peaks.get(p)) if system.startswith("ours") else None
        extra_cos = {}
        if system == "ours-bf16-weights":
            extra_cos["cosine_min_vs_ours_bf16"] = round(float((unit(vecs) * unit(timed[("ours", "bf16")][1]))
                                                               .sum(1).min()), 5)
        if system == "ours-compiled":
            extra_cos["cosine_min_vs_eager"] = round(float((unit(vecs) * unit(timed[("ours", p)][1])).sum(1).min()), 6)
            extra_cos["first_pass_s"] = round(compiled["first_pass_s"], 3)
            extra_cos["compile_s"] = round(max(0.0, compiled["first_pass_s"] - secs), 3)
        out_rows.append(row(system, p, n / secs, m, cosine_min_vs_ours_fp32=round(float(cos.min()), 5),
                            levers=LEVERS.get((system, p), []), **extra_cos))

    if args.qa:
        from dpr.data.qa import read_qa_tsv
        from dpr.eval.has_answer import has_answer

        pairs = []
        for pair in read_qa_tsv(root / "test.qa.tsv"):
            flags = [has_answer(pair.answers, t) for t in texts]
            if any(flags):
                pairs.append((pair.question, flags))
            if len(pairs) == args.qa:
                break
        questions = [q for q, _ in pairs]
        hits = np.array([f for _, f in pairs]).reshape(len(pairs), n)
        for r in out_rows:
            p = r["precision"]
            if r["system"] == "ours-bf16-weights":  # questions from the bf16 weights too, as dpr-retrieve's
                q = encode_texts(bf16_model, tok, questions, "question", batch_size=bs, autocast="off").numpy()
            elif r["system"].startswith("ours"):  # ours-onnx / -compiled: questions in torch eager, as dpr-retrieve
                m = int8_model if p == "int8" else model
                q = encode_texts(m, tok, questions, "question", batch_size=bs,
                                 autocast="bf16" if p == "bf16" else "off").numpy()
            else:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=p == "bf16"):
                    q = st.encode(questions, batch_size=bs, convert_to_numpy=True, show_progress_bar=False)
            r["top20"] = round(top_k_accuracy(q, timed[(r["system"], p)][1], hits, 20), 4) if len(q) else None
        for r in out_rows:
            r["top20_equal_ours_fp32"] = r["top20"] == next(
                x["top20"] for x in out_rows if x["system"] == "ours" and x["precision"] == "fp32")

    # Our defaults on this machine: runtime auto (ONNX Runtime where the encode runs in fp32 on an AVX-512 CPU),
    # autocast auto (bf16 where native); quantize auto is none everywhere (int8 fails the cosine bar).
    default_system = "ours-onnx" if (resolve_runtime("auto", "cpu", args.autocast) == "onnx"
                                     and ("ours-onnx", "fp32") in timed) else "ours"
    default = "bf16" if default_system == "ours" and bf16 and args.autocast in ("auto", "bf16") else "fp32"
    extra = {"n": n, "batch_size": bs, "threads": torch.get_num_threads(), "clock": args.clock, "device": str(device),
             "padded_tokens": int(sum(b * s for b, s in shapes)), "gflop": flops / 1e9,
             "tokens": real_tokens, "padded_tokens_char_sort": int(sum(b * s for b, s in char_shapes)),
             "qa_questions": args.qa and len(questions)}
    if skipped:
        extra["skipped"] = skipped
    if not args.no_corpus:
        with tempfile.TemporaryDirectory() as tmp:
            tsv = Path(tmp) / "passages.tsv"
            write_passages(tsv, rows)
            t0 = time.perf_counter()
            encode_corpus(args.model, tsv, Path(tmp) / "emb", EncodeConfig(batch_size=bs, autocast=args.autocast),
                          cache_dir=Path(tmp) / "arrow", progress=False)
            extra["encode_corpus_per_s_incl_load"] = round(n / (time.perf_counter() - t0), 1)
            if compiled is not None:  # the lever end to end, its compile counted (inductor's disk cache may
                t0 = time.perf_counter()  # already hold the row's kernels: then the compile is cheaper here)
                encode_corpus(args.model, tsv, Path(tmp) / "emb_compiled",
                              EncodeConfig(batch_size=bs, autocast=args.autocast, compile=True),
                              cache_dir=Path(tmp) / "arrow", progress=False)
                extra["encode_corpus_compiled_per_s_incl_load_and_compile"] = round(n / (time.perf_counter() - t0), 1)
    report = bench_report(out_rows, peer, default, peaks, ours_default_system=default_system, **extra)
    print(json.dumps(report, indent=1))
    print(format_table(report, [("psg/s", "per_s", ".1f"), ("MFU", "mfu", ""),
                                ("min cos", "cosine_min_vs_ours_fp32", ".4f"), ("top-20", "top20", "")]))
    if args.json:
        write_json_atomic(args.json, report, indent=1)
    return report


if __name__ == "__main__":
    main()
