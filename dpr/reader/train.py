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
from dataclasses import dataclass
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


@dataclass
class _Run:
    """One reader training run's fixed facts: its settings, its files and this process's place in it."""

    rcfg: dict
    train_path: Path
    out: Path
    fingerprint: str
    device: torch.device
    rank: int
    world: int
    main: bool
    t0: float = 0.0  # when the data began to load: the summary's and the metrics' seconds count from it

    @property
    def tcfg(self) -> dict:
        return self.rcfg["train"]

    @property
    def settings(self) -> dict:
        return {k: self.rcfg[k] for k in SETTINGS_KEYS}

    @property
    def seed(self) -> int:
        return int(self.tcfg["seed"])


@dataclass
class _Optim:
    """What updates the weights: optimizer, schedule, the fp16 loss scaler (or None) and the precision context."""

    optimizer: Any
    scheduler: Any
    scaler: Any
    autocast: Any
    precision: str


def train_reader(rcfg: Mapping[str, Any], train_path: str | Path, output_dir: str | Path,
                 overwrite: bool = False, prefetch: int = 2) -> dict:
    """Train a reader on ``train_path`` (DPR retriever JSON) into ``output_dir``; returns the summary. A finished
    run of other settings there is refused unless ``overwrite`` (then removed first). ``prefetch``: steps whose
    batches are built ahead in a background thread (0: on the training thread; the same batches either way)."""
    run = _start(plain(rcfg), Path(train_path), Path(output_dir), overwrite)
    seed_everything(run.seed)
    model, tokenizer = build_reader(run.rcfg["model"])
    model.to(run.device)
    broadcast_parameters(model)

    run.t0 = time.perf_counter()
    items, counts = _training_items(run, tokenizer)
    tcfg, bs = run.tcfg, int(run.tcfg["batch_size"])
    steps_per_epoch = math.ceil(len(items) / bs)
    total = int(tcfg["max_steps"]) if tcfg.get("max_steps", 0) > 0 else steps_per_epoch * int(tcfg["epochs"])
    opt = _optimization(run, model, total)
    start_step, _ = resume_checkpoint(tcfg.get("resume", "auto"), run.out, run.fingerprint, model, opt.optimizer,
                                      opt.scheduler, rank=run.rank, map_location=run.device, scaler=opt.scaler)
    if start_step == 0 and run.rank > 0:
        seed_everything(run.seed + run.rank)  # ranks draw different dropout masks (rank 0: a 1-process run's)
    log.info("reader: %d steps of %d questions x (1 + %d), %s on %s x %d", total, bs, int(tcfg["negatives"]),
             opt.precision, run.device, run.world)

    model.train()
    steps = _batches(run, items, tokenizer, steps_per_epoch, range(start_step, total), prefetch)
    figures = _train_steps(run, model, opt, steps, start_step, total)
    model.eval()
    summary = _finish(run, model, tokenizer, counts, total, start_step, opt.precision, figures)
    dist.barrier()
    return summary


def _start(rcfg: dict, train_path: Path, out: Path, overwrite: bool) -> _Run:
    """Join the process group, refuse a finished run of other settings (before anything is written or loaded:
    it is the user's, not ours to replace), make the output directory and set the CPU threads."""
    tcfg = rcfg["train"]
    keep_freed_memory()  # no page-fault storm per step on the CPU (dpr/perf/malloc.py)
    dist.init_distributed()
    run = _Run(rcfg, train_path, out, _fingerprint(rcfg, train_path), dist.device(), dist.rank(), dist.world_size(),
               dist.is_main())
    check_batch(int(tcfg["batch_size"]), "reader_cfg.train.batch_size")
    check_finished_run(out, run.fingerprint, rcfg, overwrite=overwrite, outputs=("reader",),
                       fingerprint_of=lambda old: _fingerprint(old, train_path), ignored=RESUMABLE_KEYS,
                       ignored_sections=("eval",), remove=run.main)
    dist.barrier()
    out.mkdir(parents=True, exist_ok=True)
    if tcfg.get("cpu_threads", 0) > 0:
        torch.set_num_threads(int(tcfg["cpu_threads"]))
    return run


def _training_items(run: _Run, tokenizer: Any) -> tuple[list, Any]:
    """The training questions as reader items and their counts; a ValueError when none is usable."""
    records = read_retriever_json(run.train_path)
    if run.tcfg.get("max_questions", 0) > 0:
        records = records[: int(run.tcfg["max_questions"])]
    items, counts = prepare_items(records, tokenizer, run.settings)
    log.info("reader training data %s: %s", run.train_path, counts.as_dict())
    if not items:
        raise ValueError(f"{run.train_path}: no usable training question (counts: {counts.as_dict()})")
    return items, counts


def _optimization(run: _Run, model: torch.nn.Module, total: int) -> _Optim:
    tcfg = run.tcfg
    optimizer = build_optimizer(model, lr=float(tcfg["lr"]), weight_decay=float(tcfg["weight_decay"]))
    scheduler = linear_schedule(optimizer, resolve_warmup(0, float(tcfg["warmup_ratio"]), total), total)
    autocast, precision = precision_context(str(tcfg.get("precision", "auto")), run.device, training=True)
    scaler = torch.amp.GradScaler(run.device.type) if precision == "fp16" else None  # fp16 (a GPU's auto) scales
    return _Optim(optimizer, scheduler, scaler, autocast, precision)


def _batches(run: _Run, items: list, tokenizer: Any, steps_per_epoch: int, steps: range, prefetch: int) -> Any:
    """``(epoch, first, last, batch)`` per step of ``steps``: this rank's share (questions ``first:last``) of the
    step's batch, a function of (seed, step) only; built ``prefetch`` steps ahead in a background thread."""
    seed, bs, negatives, settings = run.seed, int(run.tcfg["batch_size"]), int(run.tcfg["negatives"]), run.settings
    orders: dict[int, np.ndarray] = {}  # the epoch's order (the worker's alone)
    # the worker's own tokenizer: a fast tokenizer's padding/truncation state is not to be shared across threads
    worker_tok = copy.deepcopy(tokenizer) if prefetch > 0 else tokenizer

    def build(step: int) -> tuple[int, int, int, dict]:
        epoch, pos = divmod(step, steps_per_epoch)
        if epoch not in orders:
            orders.clear()
            orders[epoch] = np.random.RandomState(seed + epoch).permutation(len(items))
        batch_items = [items[i] for i in orders[epoch][pos * bs:(pos + 1) * bs]]
        batch = collate(batch_items, worker_tok, settings, negatives, random.Random(seed * 1_000_003 + step))
        n = len(batch_items)
        first, last = run.rank * n // run.world, (run.rank + 1) * n // run.world  # this rank's share
        return epoch, first, last, batch_share(batch, first, last) if run.world > 1 else batch

    return prefetched(build, steps, prefetch, pin_memory=run.device.type == "cuda")


def _train_steps(run: _Run, model: torch.nn.Module, opt: _Optim, steps: Any, start_step: int, total: int) -> dict:
    """Steps ``start_step``..``total`` over the batches ``steps``: each logged, checkpoints saved; the last
    step's figures."""
    logger = MetricsLogger(run.out, resume_step=start_step, validation=False, enabled=run.main)
    figures: dict = {}
    try:
        for step, (epoch, first, last, batch) in zip(range(start_step, total), steps):
            loss, lr, grad_norm, figures = _step(run, model, opt, batch, last - first)
            figures = {"step": step + 1, "epoch": epoch, "loss": loss, "lr": lr, "grad_norm": float(grad_norm),
                       "seconds": round(time.perf_counter() - run.t0, 2), **figures}
            logger.log_train(step + 1, {k: v for k, v in figures.items() if k != "step"})
            if (step + 1) % max(1, int(run.tcfg.get("log_every", 20))) == 0:
                log.info("step %d/%d loss %.4f span %.4f rel-acc %.2f", step + 1, total, figures["loss"],
                         figures["span_loss"], figures["relevance_accuracy"])
            _maybe_checkpoint(run, model, opt, step + 1, total)
    finally:
        steps.close()  # no batch left building behind an error
        logger.close()
    return figures


def _step(run: _Run, model: torch.nn.Module, opt: _Optim, batch: dict,
          share: int) -> tuple[float, float, Any, dict]:
    """One update on this rank's ``share`` of the batch's questions: (loss, lr, grad norm, loss figures), the
    loss and figures summed over ranks."""
    weight = global_weight(share)  # this rank's part of the global mean over questions
    if share > 0:
        inputs = [batch[k].to(run.device, non_blocking=True)
                  for k in ("input_ids", "attention_mask", "passage_mask", "token_type_ids")]
        with opt.autocast:
            start, end, rel = model(*inputs)
        loss, figures = reader_loss(start, end, rel, batch)
        part = loss if weight == 1.0 else loss * weight
        (part if opt.scaler is None else opt.scaler.scale(part)).backward()
    else:  # a short last batch leaves this rank no question: it adds zero gradients
        part, figures = torch.zeros(()), {"span_loss": 0.0, "relevance_loss": 0.0, "relevance_accuracy": 0.0}
        loss = part
    all_reduce_grads(model)
    lr, grad_norm = apply_update(model.parameters(), opt.optimizer, opt.scheduler, float(run.tcfg["max_grad_norm"]),
                                 opt.scaler)
    if run.world > 1:
        figures = {k: global_sum(v * weight) for k, v in figures.items()}
        loss = torch.tensor(global_sum(part.item()))
    return loss.item(), lr, grad_norm, figures


def _maybe_checkpoint(run: _Run, model: torch.nn.Module, opt: _Optim, done: int, total: int) -> None:
    """A checkpoint after step ``done`` every ``save_every`` steps and at the last (every rank's RNG state; rank 0
    writes)."""
    save_every = int(run.tcfg.get("save_every", 0))
    if save_every > 0 and (done % save_every == 0 or done == total):
        rngs = dist.all_gather_object(rng_state())
        if run.main:
            save_checkpoint(run.out, done, model, opt.optimizer, opt.scheduler, opt.scaler,
                            {"fingerprint": run.fingerprint}, rngs, keep=int(run.tcfg.get("keep_checkpoints", 1)))


def _finish(run: _Run, model: torch.nn.Module, tokenizer: Any, counts: Any, total: int, start_step: int,
            precision: str, figures: dict) -> dict:
    final = run.out / "reader"
    summary = {
        "model_dir": str(final), "steps": total, "resumed_from_step": start_step, "precision": precision,
        "data": counts.as_dict(), "final": figures, "seconds": round(time.perf_counter() - run.t0, 1),
        "fingerprint": run.fingerprint, "device": str(run.device), "world_size": run.world, "config": run.rcfg,
    }
    if run.main:
        save_reader(model, tokenizer, final, run.settings)
        write_json_atomic(run.out / "train_summary.json", summary)
        log.info("reader saved to %s (%d steps, %.0f s)", final, total, summary["seconds"])
    return summary
