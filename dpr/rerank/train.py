"""The cross-encoder's training loop: AdamW with linear warm-up/decay, seeded, resumable, validated.

Optimizer, schedule, clipping and the checkpoint format are the retriever trainer's
(``dpr.training.optim`` / ``dpr.training.checkpoint``), as the reader's are. A step's groups are a pure
function of (seed, step) (`dpr.rerank.data.GroupBatches`) and dropout's RNG state travels in the
checkpoint, so a run killed and resumed ends with the weights of an uninterrupted one.

Output: ``<output_dir>/cross_encoder/`` (`dpr.rerank.model`; the best dev weights when validated, else the
last), ``train_summary.json``, ``metrics.jsonl`` / ``validation.jsonl`` (`dpr.training.metrics_log`),
``checkpoints/step_<n>/`` and ``checkpoints/best/``.
"""

from __future__ import annotations

import hashlib
import json
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
from dpr.rerank.score import precision_context
from dpr.rerank.validate import RerankValidator
from dpr.training.checkpoint import (load_best, load_checkpoint, read_state, resolve_resume, rng_state,
                                     save_best, save_checkpoint, set_rng_state)
from dpr.training.metrics_log import MetricsLogger
from dpr.training.optim import build_optimizer, clip_gradients, linear_schedule, resolve_warmup

log = logging.getLogger(__name__)

# Settings that do not change what a step computes: a run may resume with other values.
_RESUMABLE = {"max_steps", "epochs", "save_every", "keep_checkpoints", "resume", "log_every", "cpu_threads",
              "eval_every", "val_max_questions", "best_metric"}


def as_config(cfg: Any) -> RerankConfig:
    """A checked `RerankConfig` from a dataclass, a dict or a Hydra node."""
    if isinstance(cfg, RerankConfig):
        cfg.check()
        return cfg
    from omegaconf import DictConfig, OmegaConf

    return RerankConfig.from_dict(OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg)


def _fingerprint(cfg: RerankConfig, train_path: Path) -> str:
    d = cfg.as_dict()
    d["train"] = {k: v for k, v in d["train"].items() if k not in _RESUMABLE}
    d.pop("score")
    st = train_path.stat()
    blob = json.dumps({**d, "file": [st.st_size, st.st_mtime_ns]}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _resume(tcfg, out: Path, fingerprint: str, model, optimizer, scheduler) -> tuple[int, dict]:
    ckpt = resolve_resume(tcfg.resume, out)
    if ckpt is None:
        return 0, {}
    if read_state(ckpt).get("fingerprint") != fingerprint:
        if str(tcfg.resume).lower() != "auto":
            raise ValueError(f"{ckpt}: checkpoint of a different run (model, data or settings changed)")
        log.warning("ignoring %s: written by a run with other settings or data", ckpt)
        return 0, {}
    state, rng = load_checkpoint(ckpt, model, optimizer, scheduler)
    set_rng_state(rng[0])  # dropout draws continue where the killed run left them
    log.info("resumed from %s at step %d", ckpt, int(state["step"]))
    return int(state["step"]), state


def forward_logits(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], autocast: Any,
                   length_bucket_size: int = 0) -> torch.Tensor:
    """The one logit of every row of ``batch`` (float32, ``[rows]``), with the graph for backward.

    ``length_bucket_size`` > 0: the retriever trainer's length buckets (`dpr.models.length_buckets`), for
    pairs: rows sorted by token length, forwarded that many at a time, each bucket cut to its own longest row
    (a row's logit is the one forward's up to float rounding); the buckets share one backward, so loss and
    gradients are the one forward's. Why: on the CPU one forward of 32 pairs of ~190 tokens trains 1.8x
    slower in fp32 than four buckets of 8 (`scripts/bench_rerank.py`, docs/results/benchmarks.md).
    """
    with autocast:
        logits = encode_bucketed(lambda **inputs: model(**inputs).logits, batch, length_bucket_size)
    return logits.float().view(-1)


def train_step(model: torch.nn.Module, tokenizer: Any, groups: Sequence[Group], optimizer: torch.optim.Optimizer,
               scheduler: Any, loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
               autocast: Any, max_length: int, use_title: bool, max_grad_norm: float,
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
    lr = scheduler.get_last_lr()[0]
    grad_norm = clip_gradients(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
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
    torch.manual_seed(int(tcfg.seed))  # the head's initialisation
    model, tokenizer = build_cross_encoder(cfg.model)
    settings = cfg.settings()

    t0 = time.perf_counter()
    examples, kind = read_groups_source(train_path)
    if tcfg.max_questions > 0:
        examples = examples[: tcfg.max_questions]
    batches = GroupBatches(examples, tcfg.batch_size, tcfg.negatives, tcfg.seed, multi_positive=kind == "qrels")
    total = tcfg.max_steps if tcfg.max_steps > 0 else batches.steps_per_epoch * tcfg.epochs
    validator = None
    if dev:
        records = list(dev)[: tcfg.val_max_questions] if tcfg.val_max_questions > 0 else list(dev)
        validator = RerankValidator(records, cfg.score.k, settings, qrels=dev_qrels, primary_metric=tcfg.best_metric,
                                    batch_size=cfg.score.batch_size, precision=tcfg.precision)

    optimizer = build_optimizer(model, lr=tcfg.lr, weight_decay=tcfg.weight_decay)
    scheduler = linear_schedule(optimizer, resolve_warmup(0, tcfg.warmup_ratio, total), total)
    fingerprint = _fingerprint(cfg, train_path)
    start_step, state = _resume(tcfg, out, fingerprint, model, optimizer, scheduler)
    best = state.get("best")
    autocast, precision = precision_context(tcfg.precision)
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
                                {"fingerprint": fingerprint, "best": best}, [rng_state()], keep=tcfg.keep_checkpoints)
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
