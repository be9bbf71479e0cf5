"""The cross-encoder's training loop: AdamW with linear warm-up/decay, seeded, resumable, validated.

Optimizer, schedule, clipping, precision, seeding, the metrics log and the checkpoint format are the training
kit's (`dpr.trainkit`), as the retriever's and the reader's are. A step's groups are a pure
function of (seed, step) (`dpr.rerank.data.GroupBatches`) and dropout's RNG state travels in the
checkpoint, so a run killed and resumed ends with the weights of an uninterrupted one.

Output: ``<output_dir>/cross_encoder/`` (`dpr.rerank.model`; the best dev weights when validated, else the
last), ``train_summary.json``, ``metrics.jsonl`` / ``validation.jsonl`` (`dpr.trainkit.metrics_log`),
``checkpoints/step_<n>/`` and ``checkpoints/best/``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from dpr.atomic import write_json_atomic
from dpr.models.length_buckets import encode_bucketed
from dpr.perf.malloc import keep_freed_memory
from dpr.rerank.config import RerankConfig
from dpr.rerank.data import Group, GroupBatches, collate, read_groups_source
from dpr.rerank.losses import LOSSES, group_accuracy
from dpr.rerank.model import FINAL_DIR, build_cross_encoder, save_cross_encoder
from dpr.rerank.validate import RerankValidator
from dpr.trainkit.checkpoint import (RESUMABLE_KEYS, file_identity, fingerprint, load_best, resume_checkpoint,
                                     save_best, save_checkpoint)
from dpr.trainkit.config_dict import plain
from dpr.trainkit.metrics_log import MetricsLogger
from dpr.trainkit.optim import apply_update, build_optimizer, linear_schedule, resolve_warmup
from dpr.trainkit.precision import AutocastCtx, autocast_scope, precision_context
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


def _fingerprint(cfg: RerankConfig, train_path: Path) -> str:
    d = cfg.as_dict()
    d["train"] = {k: v for k, v in d["train"].items() if k not in _RESUMABLE}
    d.pop("score")
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


def train_step(model: torch.nn.Module, tokenizer: Any, groups: Sequence[Group], optimizer: torch.optim.Optimizer,
               scheduler: Any, loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
               autocast: AutocastCtx, max_length: int, use_title: bool, max_grad_norm: float,
               length_bucket_size: int = 0) -> dict:
    """One optimizer step on ``groups`` (what `train_cross_encoder` runs per step; `scripts/bench_rerank.py`
    times it): tokenize the groups' pairs into one batch, forward under ``autocast`` (in length buckets:
    `forward_logits`), ``loss_fn`` over the ``[groups, 1 + N]`` logits, backward, clip, AdamW and
    schedule step. Returns the step's figures (loss and group accuracy before the update, the learning rate
    it used, the gradient norm before clipping)."""
    batch = collate(groups, tokenizer, max_length, use_title)
    positive, ignore = batch.pop("positive"), batch.pop("ignore")
    scores = forward_logits(model, batch, autocast, length_bucket_size).view(len(groups), -1)
    loss = loss_fn(scores, positive, ignore)
    loss.backward()
    lr, grad_norm = apply_update(model.parameters(), optimizer, scheduler, max_grad_norm)
    return {"loss": loss.item(), "accuracy": group_accuracy(scores.detach(), positive, ignore), "lr": lr,
            "grad_norm": grad_norm}


def train_cross_encoder(cfg: Any, train_json: str | Path, output_dir: str | Path,
                        dev: Sequence[Mapping[str, Any]] | None = None,
                        dev_qrels: Mapping[str, Mapping[str, int]] | None = None) -> dict:
    """Train a cross-encoder on ``train_json`` (DPR retriever JSON with BM25 ``hard_negative_ctxs``) into
    ``output_dir``; ``dev``: a first stage's dev results records (their top ``rerank.score.k`` reranked at
    each validation; ``dev_qrels`` by ``query_id`` on qrels data). Returns the summary."""
    cfg = as_config(cfg)
    tcfg = cfg.train
    keep_freed_memory()  # no page-fault storm per step on the CPU (dpr/perf/malloc.py)
    train_path, out = Path(train_json), Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tcfg.cpu_threads > 0:
        torch.set_num_threads(int(tcfg.cpu_threads))
    seed_everything(int(tcfg.seed))  # the head's initialisation
    model, tokenizer = build_cross_encoder(cfg.model)
    settings = cfg.settings()

    t0 = time.perf_counter()
    examples, kind = read_groups_source(train_path)
    if tcfg.max_questions > 0:
        examples = examples[: tcfg.max_questions]
    batches = GroupBatches(examples, tcfg.batch_size, tcfg.negatives, tcfg.seed, multi_positive=kind == "qrels",
                           negatives_from=tcfg.negatives_from)
    total = tcfg.max_steps if tcfg.max_steps > 0 else batches.steps_per_epoch * tcfg.epochs
    validator = None
    if dev:
        records = list(dev)[: tcfg.val_max_questions] if tcfg.val_max_questions > 0 else list(dev)
        validator = RerankValidator(records, cfg.score.k, settings, qrels=dev_qrels, primary_metric=tcfg.best_metric,
                                    batch_size=cfg.score.batch_size, precision=tcfg.precision)

    optimizer = build_optimizer(model, lr=tcfg.lr, weight_decay=tcfg.weight_decay)
    scheduler = linear_schedule(optimizer, resolve_warmup(0, tcfg.warmup_ratio, total), total)
    run_fingerprint = _fingerprint(cfg, train_path)
    start_step, state = resume_checkpoint(tcfg.resume, out, run_fingerprint, model, optimizer, scheduler)
    best = state.get("best")
    autocast, precision = precision_context(tcfg.precision, "cpu", training=True)
    loss_fn = LOSSES[tcfg.loss]
    logger = MetricsLogger(out, resume_step=start_step)
    log.info("cross-encoder: %d %s questions, %d steps of %d x (1 + %d), loss %s, %s", len(examples), kind, total,
             tcfg.batch_size, tcfg.negatives, tcfg.loss, precision)

    model.train()
    figures: dict = {}
    try:
        for step in range(start_step, total):
            epoch, groups = batches.groups(step)
            figures = {"epoch": epoch, **train_step(model, tokenizer, groups, optimizer, scheduler, loss_fn, autocast,
                                                    cfg.max_length, cfg.title, tcfg.max_grad_norm,
                                                    tcfg.length_bucket_size),
                       "seconds": round(time.perf_counter() - t0, 2)}
            logger.log_train(step + 1, figures)
            if (step + 1) % tcfg.log_every == 0:
                log.info("step %d/%d loss %.4f group-acc %.2f", step + 1, total, figures["loss"], figures["accuracy"])
            last = step + 1 == total
            if validator is not None and (last or (tcfg.eval_every > 0 and (step + 1) % tcfg.eval_every == 0)):
                best = _validate(validator, model, tokenizer, out, step + 1, logger, best)
                model.train()
            if tcfg.save_every > 0 and ((step + 1) % tcfg.save_every == 0 or last):
                save_checkpoint(out, step + 1, model, optimizer, scheduler, None,
                                {"fingerprint": run_fingerprint, "best": best}, [rng_state()],
                                keep=tcfg.keep_checkpoints)
    finally:
        logger.close()
    model.eval()
    if best is not None:
        load_best(out, model)  # the saved model is the best dev weights
    final = save_cross_encoder(model, tokenizer, out / FINAL_DIR, settings,
                               extra={"base_model": cfg.model, "trained_steps": total, "kind": kind})
    summary = {"model_dir": str(final), "steps": total, "resumed_from_step": start_step, "precision": precision,
               "kind": kind, "questions": len(examples), "final": figures, "best": best,
               "seconds": round(time.perf_counter() - t0, 1), "config": cfg.as_dict()}
    write_json_atomic(out / "train_summary.json", summary)
    log.info("cross-encoder saved to %s (%d steps, %.0f s)", final, total, summary["seconds"])
    return summary


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
