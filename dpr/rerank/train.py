"""The cross-encoder's training loop: AdamW with linear warm-up/decay, seeded, resumable, validated.

Optimizer, schedule, clipping, precision, seeding, the metrics log and the checkpoint format are the training
kit's (`dpr.trainkit`), as the retriever's and the reader's are. A step's groups are a pure
function of (seed, step) (`dpr.rerank.data.GroupBatches`) and dropout's RNG state travels in the
checkpoint, so a run killed and resumed ends with the weights of an uninterrupted one.

Output: ``<output_dir>/cross_encoder/`` (`dpr.rerank.model`; the best dev weights when validated, else the
last; with ``rerank.model.lora`` the adapters and head on the named base, as are the checkpoints: `dpr.rerank.adapters`), ``train_summary.json``, ``metrics.jsonl`` / ``validation.jsonl`` (`dpr.trainkit.metrics_log`),
``checkpoints/step_<n>/`` and ``checkpoints/best/``. A finished run of other settings in ``output_dir`` is refused
unless ``overwrite`` (`dpr.trainkit.finished_run`).

The model runs on the one device rule's device (`dpr.distributed.device`: ``cuda:LOCAL_RANK`` when CUDA is present),
at the precision rule's precision there (`dpr.trainkit.precision`). Under ``torchrun`` the run is data-parallel
(`dpr.trainkit.data_parallel`): ``batch_size`` stays the global questions per step, each rank forwards its share,
the gradients are summed over ranks, and rank 0 alone validates and writes; 2 processes compute the 1-process
losses and weights up to float rounding (without dropout, whose draws are per rank).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from dpr import distributed as dist
from dpr.atomic import write_json_atomic
from dpr.models.length_buckets import encode_bucketed
from dpr.perf.malloc import keep_freed_memory
from dpr.rerank.collapse import check_scores_vary
from dpr.rerank.config import RerankConfig
from dpr.rerank.data import Group, GroupBatches, collate, read_groups_source
from dpr.rerank.losses import LOSSES, bce_loss, group_accuracy
from dpr.rerank.model import CONFIG_FILE, FINAL_DIR, build_cross_encoder, save_cross_encoder
from dpr.rerank.validate import RerankValidator
from dpr.training.resume import check_lora_base, lora_base_fingerprint
from dpr.trainkit.checkpoint import (RESUMABLE_KEYS, file_identity, fingerprint, load_best, read_state, resolve_resume,
                                     resume_checkpoint, save_best, save_checkpoint)
from dpr.trainkit.config_dict import plain
from dpr.trainkit.data_parallel import all_reduce_grads, broadcast_parameters, check_batch, global_sum, global_weight, share
from dpr.trainkit.finished_run import check_finished_run
from dpr.trainkit.metrics_log import MetricsLogger
from dpr.trainkit.optim import apply_update, build_optimizer, linear_schedule, resolve_warmup
from dpr.trainkit.precision import AutocastCtx, autocast_scope, precision_context
from dpr.trainkit.prefetch import prefetched
from dpr.trainkit.seed import rng_state, seed_everything

log = logging.getLogger(__name__)

# Settings that do not change what a step computes: a run may resume with other values.
_RESUMABLE = RESUMABLE_KEYS | {"eval_every", "val_max_questions", "best_metric"}


def as_config(cfg: Any) -> RerankConfig:
    """A checked `RerankConfig` from a dataclass, a dict or a Hydra node."""
    if isinstance(cfg, RerankConfig):
        cfg.check()
        return cfg
    return RerankConfig.from_dict(plain(cfg))


def _fingerprint(cfg: RerankConfig | Mapping[str, Any], train_path: Path) -> str:
    """The run's identity; also of a config as a finished run's summary recorded it (`RerankConfig.as_dict`)."""
    d = dict(cfg.as_dict() if isinstance(cfg, RerankConfig) else cfg)
    d["train"] = {k: v for k, v in d["train"].items() if k not in _RESUMABLE}
    d.pop("score", None)
    return fingerprint({**d, "file": file_identity(train_path)})


def forward_logits(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], autocast: AutocastCtx,
                   length_bucket_size: int = 0) -> torch.Tensor:
    """The one logit of every row of ``batch`` (float32, ``[rows]``), with the graph for backward.

    ``length_bucket_size`` > 0: the retriever trainer's length buckets (`dpr.models.length_buckets`), for
    pairs: rows sorted by token length, forwarded that many at a time, each bucket cut to its own longest row
    (a row's logit is the one forward's up to float rounding); the buckets share one backward, so loss and
    gradients are the one forward's. Why: on the CPU one forward of 32 pairs of ~190 tokens trains 1.8x
    slower in fp32 than four buckets of 8 (`scripts/bench_rerank.py`, docs/results/benchmarks.md).
    """
    with autocast_scope(autocast):
        logits = encode_bucketed(lambda **inputs: model(**inputs).logits, batch, length_bucket_size)
    return logits.float().view(-1)


@dataclasses.dataclass(frozen=True)
class StepRecipe:
    """What every training step computes with, fixed for a run: the loss over a step's ``[groups, 1 + N]`` logits
    (`dpr.rerank.losses`), the autocast context (`dpr.trainkit.precision`), the pairs' token budget and whether
    a passage's title joins its text, the gradient-norm clip, and the length buckets (`forward_logits`)."""

    loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    autocast: AutocastCtx
    max_length: int
    use_title: bool
    max_grad_norm: float
    length_bucket_size: int = 0


def train_step(model: torch.nn.Module, tokenizer: Any, groups: Sequence[Group], optimizer: torch.optim.Optimizer,
               scheduler: Any, recipe: StepRecipe, device: torch.device | str | None = None, scaler: Any = None,
               batch: Mapping[str, torch.Tensor] | None = None) -> dict:
    """One optimizer step on ``groups`` (what `train_cross_encoder` runs per step; `scripts/bench_rerank.py`
    times it): tokenize the groups' pairs into one batch on ``device`` (None: the model's), forward under the
    recipe's autocast (in length buckets: `forward_logits`), its loss over the ``[groups, 1 + N]`` logits, backward,
    clip, AdamW and schedule step. Under torchrun ``groups`` is the global batch: this rank's share is forwarded
    and the gradients summed over ranks (module doc). ``batch``: this rank's share already collated (built off the
    training thread: `dpr.trainkit.prefetch`). Returns the step's figures (loss and group accuracy before the
    update, the learning rate it used, the gradient norm before clipping)."""
    device = next(model.parameters()).device if device is None else torch.device(device)
    mine = share(groups)
    if batch is None:
        batch = collate(mine, tokenizer, recipe.max_length, recipe.use_title)
    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    positive, ignore = batch.pop("positive"), batch.pop("ignore")
    scores = forward_logits(model, batch, recipe.autocast, recipe.length_bucket_size).view(len(mine), -1)
    loss = recipe.loss_fn(scores, positive, ignore)
    # this rank's part of the global mean: its share of the groups (listwise) or of the kept pairs (bce)
    weight = 1.0 if not dist.is_distributed() else \
        global_weight(float((~ignore).sum()) if recipe.loss_fn is bce_loss else len(mine))  # (no host sync when alone)
    part = loss if weight == 1.0 else loss * weight
    (part if scaler is None else scaler.scale(part)).backward()
    all_reduce_grads(model)
    lr, grad_norm = apply_update(model.parameters(), optimizer, scheduler, recipe.max_grad_norm, scaler)
    accuracy = group_accuracy(scores.detach(), positive, ignore)
    if dist.is_distributed():
        return {"loss": global_sum(part.item()), "accuracy": global_sum(accuracy * len(mine)) / len(groups),
                "lr": lr, "grad_norm": float(grad_norm)}
    return {"loss": loss.item(), "accuracy": accuracy, "lr": lr, "grad_norm": float(grad_norm)}


@dataclasses.dataclass(frozen=True)
class _Run:
    """Where and as what this process trains (fixed before anything is built)."""

    cfg: RerankConfig
    out: Path
    fingerprint: str
    rank: int
    main: bool
    device: torch.device


@dataclasses.dataclass
class _Loop:
    """The pieces the training loop steps, and the best dev figures so far."""

    model: torch.nn.Module
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: Any
    recipe: StepRecipe
    batches: GroupBatches
    total: int
    validator: RerankValidator | None
    logger: MetricsLogger
    best: dict | None


def train_cross_encoder(cfg: Any, train_json: str | Path, output_dir: str | Path,
                        dev: Sequence[Mapping[str, Any]] | None = None,
                        dev_qrels: Mapping[str, Mapping[str, int]] | None = None, overwrite: bool = False,
                        prefetch: int = 2) -> dict:
    """Train a cross-encoder on ``train_json`` (DPR retriever JSON with BM25 ``hard_negative_ctxs``) into
    ``output_dir``; ``dev``: a first stage's dev results records (their top ``rerank.score.k`` reranked at
    each validation; ``dev_qrels`` by ``query_id`` on qrels data). A finished run of other settings there is
    refused unless ``overwrite`` (then removed first). ``prefetch``: steps whose batches are built ahead in a
    background thread (0: on the training thread; the same batches either way). Returns the summary."""
    cfg = as_config(cfg)
    tcfg = cfg.train
    keep_freed_memory()  # no page-fault storm per step on the CPU (dpr/perf/malloc.py)
    train_path = Path(train_json)
    run = _open_run(cfg, train_path, Path(output_dir), overwrite)
    model, tokenizer = _build_model(run)
    settings = cfg.settings()

    t0 = time.perf_counter()
    examples, kind = read_groups_source(train_path)
    if tcfg.max_questions > 0:
        examples = examples[: tcfg.max_questions]
    batches = GroupBatches(examples, tcfg.batch_size, tcfg.negatives, tcfg.seed, multi_positive=kind == "qrels",
                           negatives_from=tcfg.negatives_from)
    total = tcfg.max_steps if tcfg.max_steps > 0 else batches.steps_per_epoch * tcfg.epochs
    validator = _validator(cfg, settings, dev, dev_qrels)
    optimizer = build_optimizer(model, lr=tcfg.lr, weight_decay=tcfg.weight_decay)
    scheduler = linear_schedule(optimizer, resolve_warmup(0, tcfg.warmup_ratio, total), total)
    autocast, precision = precision_context(tcfg.precision, run.device, training=True)
    scaler = torch.amp.GradScaler(run.device.type) if precision == "fp16" else None  # fp16 (a GPU's auto) scales
    start_step, state = _resume(run, model, optimizer, scheduler, scaler)
    recipe = StepRecipe(LOSSES[tcfg.loss], autocast, cfg.max_length, cfg.title, tcfg.max_grad_norm,
                        tcfg.length_bucket_size)
    loop = _Loop(model, tokenizer, optimizer, scheduler, scaler, recipe, batches, total, validator,
                 MetricsLogger(run.out, resume_step=start_step, enabled=run.main), state.get("best"))
    log.info("cross-encoder: %d %s questions, %d steps of %d x (1 + %d), loss %s, %s on %s x %d", len(examples), kind,
             total, tcfg.batch_size, tcfg.negatives, tcfg.loss, precision, run.device, dist.world_size())
    figures = _fit(run, loop, start_step, prefetch, t0)
    # before the run is called done (every rank: they hold the same weights)
    check_scores_vary(model, tokenizer, examples, max_length=cfg.max_length, use_title=cfg.title, where=str(run.out))
    final = _save(run, loop, settings, {"base_model": cfg.model.name, "trained_steps": total, "kind": kind})
    summary = {"model_dir": str(final), "steps": total, "resumed_from_step": start_step, "precision": precision,
               "device": str(run.device), "world_size": dist.world_size(), "kind": kind, "questions": len(examples),
               "final": figures, "best": loop.best, "seconds": round(time.perf_counter() - t0, 1),
               "fingerprint": run.fingerprint, "config": cfg.as_dict()}
    if run.main:
        write_json_atomic(run.out / "train_summary.json", summary)
    dist.barrier()
    log.info("cross-encoder saved to %s (%d steps, %.0f s)", final, total, summary["seconds"])
    return summary


def _open_run(cfg: RerankConfig, train_path: Path, out: Path, overwrite: bool) -> _Run:
    """Join the process group and claim ``out``: a finished run of other settings there is refused (or, with
    ``overwrite``, removed) before anything is written or loaded -- it is the user's, not ours to replace."""
    dist.init_distributed()
    rank, main, device = dist.rank(), dist.is_main(), dist.device()
    check_batch(cfg.train.batch_size, "rerank.train.batch_size")
    run_fingerprint = _fingerprint(cfg, train_path)
    check_finished_run(out, run_fingerprint, cfg.as_dict(), overwrite=overwrite, outputs=(FINAL_DIR,),
                       fingerprint_of=lambda old: _fingerprint(old, train_path),
                       ignored=_RESUMABLE, ignored_sections=("score",), remove=main)
    dist.barrier()
    out.mkdir(parents=True, exist_ok=True)
    return _Run(cfg, out, run_fingerprint, rank, main, device)


def _build_model(run: _Run) -> tuple[torch.nn.Module, Any]:
    """The cross-encoder (with LoRA: adapters + a new head train) on the run's device, the same on every rank."""
    cfg = run.cfg
    if cfg.train.cpu_threads > 0:
        torch.set_num_threads(int(cfg.train.cpu_threads))
    seed_everything(int(cfg.train.seed))  # the head's initialisation
    model, tokenizer = build_cross_encoder(cfg.model.name, lora=cfg.model.lora)
    model.to(run.device)
    broadcast_parameters(model)
    return model, tokenizer


def _validator(cfg: RerankConfig, settings: Mapping[str, Any], dev: Sequence[Mapping[str, Any]] | None,
               dev_qrels: Mapping[str, Mapping[str, int]] | None) -> RerankValidator | None:
    if not dev:
        return None
    tcfg = cfg.train
    records = list(dev)[: tcfg.val_max_questions] if tcfg.val_max_questions > 0 else list(dev)
    return RerankValidator(records, cfg.score.k, settings, qrels=dev_qrels, primary_metric=tcfg.best_metric,
                           batch_size=cfg.score.batch_size, precision=tcfg.precision)


def _resume(run: _Run, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
            scaler: Any) -> tuple[int, dict]:
    """``(first step, checkpoint state)``: this run's latest checkpoint restored, or step 0 (each rank past 0 its
    own dropout seed)."""
    cfg, out = run.cfg, run.out
    # adapters resume only on the base they were trained on (checked before they are loaded onto this one)
    resuming = resolve_resume(cfg.train.resume, out)
    if resuming is not None and read_state(resuming).get("fingerprint") != run.fingerprint:
        resuming = None  # another run's: resume_checkpoint ignores (or refuses) it
    check_lora_base(out, lora_base_fingerprint(cfg.model.name, cfg.model.lora), resuming,
                    markers=[out / FINAL_DIR / CONFIG_FILE])
    start_step, state = resume_checkpoint(cfg.train.resume, out, run.fingerprint, model, optimizer, scheduler,
                                          rank=run.rank, map_location=run.device, scaler=scaler)
    if start_step == 0 and run.rank > 0:
        # ranks draw different dropout masks (rank 0: a 1-process run's)
        seed_everything(int(cfg.train.seed) + run.rank)
    return start_step, state


def _fit(run: _Run, loop: _Loop, start_step: int, prefetch: int, t0: float) -> dict:
    """Steps ``start_step`` to the last, validating and checkpointing on the way; the last step's figures."""
    cfg, tcfg, model = run.cfg, run.cfg.train, loop.model
    model.train()
    figures: dict = {}
    # the worker's own tokenizer: a fast tokenizer's padding/truncation state is not to be shared across threads
    worker_tok = copy.deepcopy(loop.tokenizer) if prefetch > 0 else loop.tokenizer

    def build(step: int) -> tuple[int, list[Group], dict]:
        epoch, groups = loop.batches.groups(step)
        return epoch, groups, collate(share(groups), worker_tok, cfg.max_length, cfg.title)

    steps = prefetched(build, range(start_step, loop.total), prefetch, pin_memory=run.device.type == "cuda")
    try:
        for step, (epoch, groups, batch) in zip(range(start_step, loop.total), steps):
            figures = {"epoch": epoch, **train_step(model, loop.tokenizer, groups, loop.optimizer, loop.scheduler,
                                                    loop.recipe, run.device, loop.scaler, batch),
                       "seconds": round(time.perf_counter() - t0, 2)}
            loop.logger.log_train(step + 1, figures)
            if (step + 1) % tcfg.log_every == 0:
                log.info("step %d/%d loss %.4f group-acc %.2f", step + 1, loop.total, figures["loss"],
                         figures["accuracy"])
            last = step + 1 == loop.total
            if run.main and loop.validator is not None and (
                    last or (tcfg.eval_every > 0 and (step + 1) % tcfg.eval_every == 0)):
                loop.best = _validate(loop.validator, model, loop.tokenizer, run.out, step + 1, loop.logger, loop.best)
                model.train()
            if tcfg.save_every > 0 and ((step + 1) % tcfg.save_every == 0 or last):
                rngs = dist.all_gather_object(rng_state())  # every rank's dropout state, rank 0 writes
                if run.main:
                    save_checkpoint(run.out, step + 1, model, loop.optimizer, loop.scheduler, loop.scaler,
                                    {"fingerprint": run.fingerprint, "best": loop.best}, rngs,
                                    keep=tcfg.keep_checkpoints)
    finally:
        steps.close()  # no batch left building behind an error
        loop.logger.close()
    return figures


def _save(run: _Run, loop: _Loop, settings: Mapping[str, Any], extra: dict) -> Path:
    """Save the best dev weights (or the last) as the run's cross-encoder (rank 0); its directory."""
    cfg, model = run.cfg, loop.model
    model.eval()
    final = run.out / FINAL_DIR
    if run.main:
        if loop.best is not None:
            load_best(run.out, model, map_location=str(run.device))  # the saved model is the best dev weights
        if cfg.model.lora is not None:  # the adapters' base, checked when they load
            from dpr.rerank.adapters import saved_info

            extra = {**extra, **saved_info(cfg.model.name, cfg.model.lora)}
        save_cross_encoder(model, loop.tokenizer, final, settings, extra=extra)
    return final


def _validate(validator: RerankValidator, model, tokenizer, out: Path, step: int, logger: MetricsLogger,
              best: dict | None) -> dict | None:
    metrics = validator(model, tokenizer)
    logger.log_validation(step, metrics)
    name = validator.primary_metric
    value = metrics[name]
    log.info("step %d dev %s", step, " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    if validator.is_better(value, None if best is None else best["value"]):
        best = {"step": step, "metric": name, "value": value, "greater_is_better": True, "metrics": metrics}
        save_best(out, model, best)
    return best
