"""The reader's training loop: AdamW with linear warm-up/decay, seeded, resumable.

Optimizer, schedule, clipping, precision, seeding, the metrics log and the checkpoint format are the
training kit's (`dpr.trainkit`), as the retriever's and the cross-encoder's are. The data order is a pure function of
(seed, epoch) and each step's negatives of (seed, step), so a resumed run replays exactly the batches
a straight run would have seen; a checkpoint stores only the step besides the weights and states.

Output: ``<output_dir>/reader/`` (``encoder/`` in HF format, heads, ``reader.json``; ``dpr-reader eval
model=<output_dir>`` finds it), ``train_summary.json``, ``metrics.jsonl``, ``checkpoints/step_<n>/``.
"""

from __future__ import annotations

import logging
import math
import random
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from dpr.atomic import write_json_atomic
from dpr.data.retriever_json import read_retriever_json
from dpr.perf.malloc import keep_freed_memory
from dpr.reader.data import collate, prepare_items, reader_loss
from dpr.reader.model import SETTINGS_KEYS, build_reader, save_reader
from dpr.trainkit.checkpoint import RESUMABLE_KEYS, file_identity, fingerprint, resume_checkpoint, save_checkpoint
from dpr.trainkit.config_dict import plain
from dpr.trainkit.metrics_log import MetricsLogger
from dpr.trainkit.optim import apply_update, build_optimizer, linear_schedule, resolve_warmup
from dpr.trainkit.precision import precision_context
from dpr.trainkit.seed import rng_state, seed_everything

log = logging.getLogger(__name__)


def _fingerprint(rcfg: dict, train_path: Path) -> str:
    t = {k: v for k, v in rcfg["train"].items() if k not in RESUMABLE_KEYS}
    return fingerprint({"model": rcfg["model"], **{k: rcfg[k] for k in SETTINGS_KEYS}, "train": t,
                        "file": file_identity(train_path)})


def train_reader(rcfg: Mapping[str, Any], train_path: str | Path, output_dir: str | Path) -> dict:
    """Train a reader on ``train_path`` (DPR retriever JSON) into ``output_dir``; returns the summary."""
    rcfg = plain(rcfg)
    tcfg = rcfg["train"]
    keep_freed_memory()  # no page-fault storm per step on the CPU (dpr/perf/malloc.py)
    train_path, out = Path(train_path), Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tcfg.get("cpu_threads", 0) > 0:
        torch.set_num_threads(int(tcfg["cpu_threads"]))
    seed = int(tcfg["seed"])
    seed_everything(seed)
    settings = {k: rcfg[k] for k in SETTINGS_KEYS}
    model, tokenizer = build_reader(rcfg["model"])

    t0 = time.perf_counter()
    records = read_retriever_json(train_path)
    if tcfg.get("max_questions", 0) > 0:
        records = records[: int(tcfg["max_questions"])]
    items, counts = prepare_items(records, tokenizer, settings)
    log.info("reader training data %s: %s", train_path, counts.as_dict())
    if not items:
        raise ValueError(f"{train_path}: no usable training question (counts: {counts.as_dict()})")
    bs = int(tcfg["batch_size"])
    steps_per_epoch = math.ceil(len(items) / bs)
    total = int(tcfg["max_steps"]) if tcfg.get("max_steps", 0) > 0 else steps_per_epoch * int(tcfg["epochs"])

    optimizer = build_optimizer(model, lr=float(tcfg["lr"]), weight_decay=float(tcfg["weight_decay"]))
    scheduler = linear_schedule(optimizer, resolve_warmup(0, float(tcfg["warmup_ratio"]), total), total)
    run_fingerprint = _fingerprint(rcfg, train_path)
    start_step, _ = resume_checkpoint(tcfg.get("resume", "auto"), out, run_fingerprint, model, optimizer, scheduler)
    # the reader trains on the CPU (the model is never moved)
    autocast, precision = precision_context(str(tcfg.get("precision", "auto")), "cpu", training=True)

    model.train()
    logger = MetricsLogger(out, resume_step=start_step, validation=False)
    figures: dict = {}
    order: np.ndarray | None = None
    epoch_of_order = -1
    try:
        for step in range(start_step, total):
            epoch, pos = divmod(step, steps_per_epoch)
            if epoch != epoch_of_order:
                order = np.random.RandomState(seed + epoch).permutation(len(items))
                epoch_of_order = epoch
            batch_items = [items[i] for i in order[pos * bs:(pos + 1) * bs]]
            batch = collate(batch_items, tokenizer, settings, int(tcfg["negatives"]),
                            random.Random(seed * 1_000_003 + step))
            with autocast:
                start, end, rel = model(batch["input_ids"], batch["attention_mask"], batch["passage_mask"],
                                        batch["token_type_ids"])
            loss, figures = reader_loss(start, end, rel, batch)
            loss.backward()
            lr, grad_norm = apply_update(model.parameters(), optimizer, scheduler, float(tcfg["max_grad_norm"]))
            figures = {"step": step + 1, "epoch": epoch, "loss": loss.item(), "lr": lr, "grad_norm": grad_norm,
                       "seconds": round(time.perf_counter() - t0, 2), **figures}
            logger.log_train(step + 1, {k: v for k, v in figures.items() if k != "step"})
            if (step + 1) % max(1, int(tcfg.get("log_every", 20))) == 0:
                log.info("step %d/%d loss %.4f span %.4f rel-acc %.2f", step + 1, total, figures["loss"],
                         figures["span_loss"], figures["relevance_accuracy"])
            save_every = int(tcfg.get("save_every", 0))
            if save_every > 0 and ((step + 1) % save_every == 0 or step + 1 == total):
                save_checkpoint(out, step + 1, model, optimizer, scheduler, None, {"fingerprint": run_fingerprint},
                                [rng_state()], keep=int(tcfg.get("keep_checkpoints", 1)))
    finally:
        logger.close()

    model.eval()
    return _finish(model, tokenizer, settings, out, rcfg, counts, total, start_step, precision, figures, t0)


def _finish(model, tokenizer, settings, out: Path, rcfg: dict, counts, total: int, start_step: int,
            precision: str, figures: dict, t0: float) -> dict:
    final = out / "reader"
    save_reader(model, tokenizer, final, settings)
    summary = {
        "model_dir": str(final), "steps": total, "resumed_from_step": start_step, "precision": precision,
        "data": counts.as_dict(), "final": figures, "seconds": round(time.perf_counter() - t0, 1),
        "config": rcfg,
    }
    write_json_atomic(out / "train_summary.json", summary)
    log.info("reader saved to %s (%d steps, %.0f s)", final, total, summary["seconds"])
    return summary
