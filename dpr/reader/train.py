"""The reader's training loop: AdamW with linear warm-up/decay, seeded, resumable.

Optimizer, schedule, clipping, precision, seeding, the metrics log and the checkpoint format are the
training kit's (`dpr.trainkit`), as the retriever's and the cross-encoder's are. The data order is a pure function of
(seed, epoch) and each step's negatives of (seed, step), so a resumed run replays exactly the batches
a straight run would have seen; a checkpoint stores only the step besides the weights and states.

Output: ``<output_dir>/reader/`` (``encoder/`` in HF format, heads, ``reader.json``; ``dpr-reader eval
model=<output_dir>`` finds it), ``train_summary.json``, ``metrics.jsonl``, ``checkpoints/step_<n>/``. A finished run
of other settings in ``output_dir`` is refused unless ``overwrite`` (`dpr.trainkit.finished_run`).

The model runs on the one device rule's device (`dpr.distributed.device`), at the precision rule's precision
there. Under ``torchrun`` the run is data-parallel (`dpr.trainkit.data_parallel`): ``batch_size`` stays the global
questions per step, every rank collates the step's batch (the same negatives) and forwards its share of the
questions, the gradients are summed over ranks, rank 0 writes.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from dpr import distributed as dist
from dpr.atomic import write_json_atomic
from dpr.data.retriever_json import read_retriever_json
from dpr.perf.malloc import keep_freed_memory
from dpr.reader.data import batch_share, collate, prepare_items, reader_loss
from dpr.reader.model import SETTINGS_KEYS, build_reader, save_reader
from dpr.trainkit.checkpoint import RESUMABLE_KEYS, file_identity, fingerprint, resume_checkpoint, save_checkpoint
from dpr.trainkit.config_dict import plain
from dpr.trainkit.data_parallel import all_reduce_grads, broadcast_parameters, check_batch, global_sum, global_weight
from dpr.trainkit.finished_run import check_finished_run
from dpr.trainkit.metrics_log import MetricsLogger
from dpr.trainkit.optim import apply_update, build_optimizer, linear_schedule, resolve_warmup
from dpr.trainkit.precision import precision_context
from dpr.trainkit.prefetch import prefetched
from dpr.trainkit.seed import rng_state, seed_everything

log = logging.getLogger(__name__)


def _fingerprint(rcfg: dict, train_path: Path) -> str:
    t = {k: v for k, v in rcfg["train"].items() if k not in RESUMABLE_KEYS}
    return fingerprint({"model": rcfg["model"], **{k: rcfg[k] for k in SETTINGS_KEYS}, "train": t,
                        "file": file_identity(train_path)})


def train_reader(rcfg: Mapping[str, Any], train_path: str | Path, output_dir: str | Path,
                 overwrite: bool = False, prefetch: int = 2) -> dict:
    """Train a reader on ``train_path`` (DPR retriever JSON) into ``output_dir``; returns the summary. A finished
    run of other settings there is refused unless ``overwrite`` (then removed first). ``prefetch``: steps whose
    batches are built ahead in a background thread (0: on the training thread; the same batches either way)."""
    rcfg = plain(rcfg)
    tcfg = rcfg["train"]
    keep_freed_memory()  # no page-fault storm per step on the CPU (dpr/perf/malloc.py)
    dist.init_distributed()
    rank, world, main, device = dist.rank(), dist.world_size(), dist.is_main(), dist.device()
    check_batch(int(tcfg["batch_size"]), "reader_cfg.train.batch_size")
    train_path, out = Path(train_path), Path(output_dir)
    run_fingerprint = _fingerprint(rcfg, train_path)
    # before anything is written or loaded: a finished run of other settings is the user's, not ours to replace
    check_finished_run(out, run_fingerprint, rcfg, overwrite=overwrite, outputs=("reader",),
                       fingerprint_of=lambda old: _fingerprint(old, train_path), ignored=RESUMABLE_KEYS,
                       ignored_sections=("eval",), remove=main)
    dist.barrier()
    out.mkdir(parents=True, exist_ok=True)
    if tcfg.get("cpu_threads", 0) > 0:
        torch.set_num_threads(int(tcfg["cpu_threads"]))
    seed = int(tcfg["seed"])
    seed_everything(seed)
    settings = {k: rcfg[k] for k in SETTINGS_KEYS}
    model, tokenizer = build_reader(rcfg["model"])
    model.to(device)
    broadcast_parameters(model)

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
    autocast, precision = precision_context(str(tcfg.get("precision", "auto")), device, training=True)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None  # fp16 (a GPU's auto) scales
    start_step, _ = resume_checkpoint(tcfg.get("resume", "auto"), out, run_fingerprint, model, optimizer, scheduler,
                                      rank=rank, map_location=device, scaler=scaler)
    if start_step == 0 and rank > 0:
        seed_everything(seed + rank)  # ranks draw different dropout masks (rank 0: a 1-process run's)
    log.info("reader: %d steps of %d questions x (1 + %d), %s on %s x %d", total, bs, int(tcfg["negatives"]),
             precision, device, world)

    model.train()
    logger = MetricsLogger(out, resume_step=start_step, validation=False, enabled=main)
    figures: dict = {}
    orders: dict[int, np.ndarray] = {}  # the epoch's order (the worker's alone)
    # the worker's own tokenizer: a fast tokenizer's padding/truncation state is not to be shared across threads
    worker_tok = copy.deepcopy(tokenizer) if prefetch > 0 else tokenizer

    def build(step: int) -> tuple[int, int, int, dict]:
        """Step ``step``'s batch, this rank's share of it: a function of (seed, step) only."""
        epoch, pos = divmod(step, steps_per_epoch)
        if epoch not in orders:
            orders.clear()
            orders[epoch] = np.random.RandomState(seed + epoch).permutation(len(items))
        batch_items = [items[i] for i in orders[epoch][pos * bs:(pos + 1) * bs]]
        batch = collate(batch_items, worker_tok, settings, int(tcfg["negatives"]), random.Random(seed * 1_000_003 + step))
        n = len(batch_items)
        first, last = rank * n // world, (rank + 1) * n // world  # this rank's share of the questions
        return epoch, first, last, batch_share(batch, first, last) if world > 1 else batch

    steps = prefetched(build, range(start_step, total), prefetch, pin_memory=device.type == "cuda")
    try:
        for step, (epoch, first, last, batch) in zip(range(start_step, total), steps):
            weight = global_weight(last - first)  # this rank's part of the global mean over questions
            if last > first:
                inputs = [batch[k].to(device, non_blocking=True)
                          for k in ("input_ids", "attention_mask", "passage_mask", "token_type_ids")]
                with autocast:
                    start, end, rel = model(*inputs)
                loss, figures = reader_loss(start, end, rel, batch)
                part = loss if weight == 1.0 else loss * weight
                (part if scaler is None else scaler.scale(part)).backward()
            else:  # a short last batch leaves this rank no question: it adds zero gradients
                part, figures = torch.zeros(()), {"span_loss": 0.0, "relevance_loss": 0.0, "relevance_accuracy": 0.0}
            all_reduce_grads(model)
            lr, grad_norm = apply_update(model.parameters(), optimizer, scheduler, float(tcfg["max_grad_norm"]),
                                         scaler)
            if world > 1:
                figures = {k: global_sum(v * weight) for k, v in figures.items()}
                loss = torch.tensor(global_sum(part.item()))
            figures = {"step": step + 1, "epoch": epoch, "loss": loss.item(), "lr": lr, "grad_norm": float(grad_norm),
                       "seconds": round(time.perf_counter() - t0, 2), **figures}
            logger.log_train(step + 1, {k: v for k, v in figures.items() if k != "step"})
            if (step + 1) % max(1, int(tcfg.get("log_every", 20))) == 0:
                log.info("step %d/%d loss %.4f span %.4f rel-acc %.2f", step + 1, total, figures["loss"],
                         figures["span_loss"], figures["relevance_accuracy"])
            save_every = int(tcfg.get("save_every", 0))
            if save_every > 0 and ((step + 1) % save_every == 0 or step + 1 == total):
                rngs = dist.all_gather_object(rng_state())  # every rank's dropout state, rank 0 writes
                if main:
                    save_checkpoint(out, step + 1, model, optimizer, scheduler, scaler,
                                    {"fingerprint": run_fingerprint}, rngs, keep=int(tcfg.get("keep_checkpoints", 1)))
    finally:
        steps.close()  # no batch left building behind an error
        logger.close()

    model.eval()
    summary = _finish(model, tokenizer, settings, out, rcfg, counts, total, start_step, precision, figures, t0,
                      {"fingerprint": run_fingerprint, "device": str(device), "world_size": world}, main)
    dist.barrier()
    return summary


def _finish(model, tokenizer, settings, out: Path, rcfg: dict, counts, total: int, start_step: int,
            precision: str, figures: dict, t0: float, extra: dict, main: bool) -> dict:
    final = out / "reader"
    summary = {
        "model_dir": str(final), "steps": total, "resumed_from_step": start_step, "precision": precision,
        "data": counts.as_dict(), "final": figures, "seconds": round(time.perf_counter() - t0, 1),
        **extra, "config": rcfg,
    }
    if main:
        save_reader(model, tokenizer, final, settings)
        write_json_atomic(out / "train_summary.json", summary)
        log.info("reader saved to %s (%d steps, %.0f s)", final, total, summary["seconds"])
    return summary
