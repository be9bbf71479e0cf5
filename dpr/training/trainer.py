"""The training loop: ``train(cfg) -> summary`` — a plain function over a config mapping (Hydra lives in dpr.cli).

``cfg`` has ``model`` (BiEncoderConfig keys), ``data`` (``name``, ``kind``), ``train`` (:class:`TrainConfig`),
``logger`` (``type: none|wandb`` + wandb keys), ``data_dir``, ``output_dir`` and ``seed``.

One optimizer step = ``grad_accumulation_steps`` micro-batches of ``batch_size`` questions per device
(see :mod:`dpr.training.data` for what grows the negative pool and what does not), AdamW with linear
warm-up/decay, gradient clipping, bf16/fp16 autocast. Validation (dev average rank, corpus top-k) runs
at each epoch end, every ``eval_every`` steps and at the last step; the best weights (``best_metric``)
are what ``<output_dir>/`` finally holds. Checkpoints every ``save_every`` steps make a killed run
resumable to the same weights an uninterrupted run ends with.

Test hook: ``DPR_TEST_CRASH_AT_STEP=<n>`` raises after step ``n`` (and its checkpoint), to test resume.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from dpr import distributed as dist
from dpr.atomic import write_json_atomic
from dpr.config import strict_from_dict
from dpr.data.dataset import DatasetPaths
from dpr.models import load_biencoder, save_biencoder
from dpr.models.inference import cpu_supports_bf16
from dpr.training import checkpoint as ckpt
from dpr.training.data import TrainBatches, load_examples
from dpr.training.grad_cache import make_step
from dpr.training.metrics_log import MetricsLogger
from dpr.training.optim import build_optimizer, linear_schedule, make_loss_fn, optimizer_step, resolve_warmup
from dpr.training.validation import load_corpus, validate

log = logging.getLogger(__name__)

CRASH_ENV = "DPR_TEST_CRASH_AT_STEP"


@dataclass
class TrainConfig:
    """The ``train`` group. Unknown keys are an error (a typo must not silently train with defaults)."""

    batch_size: int = 16                 # questions per device per micro-batch
    hard_negatives: int = 1              # H: negatives per question besides the in-batch ones
    epochs: int = 1
    max_steps: int = 0                   # > 0: train this many optimizer steps, overriding epochs
    lr: float = 2e-5
    weight_decay: float = 0.0
    adam_betas: tuple = (0.9, 0.999)
    adam_eps: float = 1e-8
    warmup_steps: int = 0                # > 0 wins over warmup_ratio
    warmup_ratio: float = 0.1
    max_grad_norm: float = 2.0           # <= 0: no clipping
    grad_accumulation_steps: int = 1     # averages gradients; adds no negatives
    grad_cache_chunk_size: int = 0       # > 0: gradient cache with chunks of this many texts
    precision: str = "auto"              # auto | fp32 | bf16 | fp16 (fp16: CUDA only, with GradScaler)
    deterministic: bool = False          # torch deterministic algorithms (GPU; CPU runs are already)
    cpu_threads: int = 0                 # > 0: torch intra-op threads during the run (1 beats 2 on a busy 2-core box)
    shuffle: bool = True
    shuffle_positives: bool = False      # False: the first positive (DPR)
    shuffle_hard_negatives: bool = True  # DPR shuffles the negatives per epoch, then takes the first H
    dedup_positives: bool = True         # no two questions with the same positive passage in a batch
    log_every: int = 1                   # rows in metrics.jsonl / wandb
    print_every: int = 50                # lines in the log
    eval_every: int = 0                  # > 0: also validate every this many steps
    save_every: int = 0                  # > 0: checkpoint every this many steps (and at the end)
    keep_checkpoints: int = 2
    resume: Any = "auto"                 # auto | true | false | <checkpoint dir>
    validate: bool = True
    validate_at_start: bool = False      # also validate the starting weights (step 0): the untrained baseline
    val_batch_size: int = 64
    val_max_questions: int = 0           # 0: every dev question
    val_hard_negatives: int = 30         # per dev question, in the average-rank pool
    val_corpus_topk: bool = True
    val_topk: tuple = (1, 5, 20)
    val_corpus_max_passages: int = 500_000
    best_metric: str = "avg_rank"        # lower is better for *rank*, higher for the rest

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TrainConfig":
        tc = strict_from_dict(cls, d, "train")
        for key in ("batch_size", "grad_accumulation_steps", "log_every", "print_every"):
            if int(getattr(tc, key)) < 1:
                raise ValueError(f"train.{key} must be >= 1, got {getattr(tc, key)}")
        if tc.hard_negatives < 0:
            raise ValueError(f"train.hard_negatives must be >= 0, got {tc.hard_negatives}")
        if tc.precision not in ("auto", "fp32", "bf16", "fp16"):
            raise ValueError(f"train.precision must be auto, fp32, bf16 or fp16; got {tc.precision!r}")
        if tc.best_metric.startswith("top") and not tc.val_corpus_topk:
            raise ValueError(f"train.best_metric={tc.best_metric} needs train.val_corpus_topk=true")
        return tc


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto``: bf16 on CUDA with bf16 (else fp16) and on CPUs with native bf16, fp32 otherwise."""
    if precision == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "bf16" if cpu_supports_bf16() else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("train.precision=fp16 needs a GPU (loss scaling); use bf16 or fp32 on the CPU")
    if precision == "bf16" and device.type == "cpu" and not cpu_supports_bf16():
        log.warning("this CPU has no native bf16: bf16 autocast will be slower than fp32")
    return precision


def _autocast(precision: str, device: torch.device):
    if precision == "fp32":
        return None
    return lambda: torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def _set_deterministic() -> None:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def _plain_config(cfg: Any) -> dict:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    return OmegaConf.to_container(OmegaConf.create(dict(cfg)), resolve=True)


def _total_steps(batches: TrainBatches, tc: TrainConfig) -> int:
    if tc.max_steps > 0:
        return int(tc.max_steps)
    return sum(batches.num_batches(e) // tc.grad_accumulation_steps for e in range(tc.epochs))


def _is_better(metric: str, value: float, best: float | None) -> bool:
    if best is None:
        return True
    return value < best if "rank" in metric or "loss" in metric else value > best


@dataclass
class _State:
    """Everything besides tensors that a checkpoint must carry (saved as state.json)."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_value: float | None = None
    best_step: int | None = None
    train_seconds: float = 0.0
    last_train: dict = field(default_factory=dict)
    last_validation: dict = field(default_factory=dict)
    best_validation: dict = field(default_factory=dict)
    initial_validation: dict = field(default_factory=dict)
    fingerprint: str = ""


def train(cfg: Mapping[str, Any] | DictConfig, extra_summary: Mapping[str, Any] | None = None) -> dict:
    """Train a bi-encoder; returns (and writes to ``<output_dir>/train_summary.json``) the run summary."""
    conf = _plain_config(cfg)
    tc = TrainConfig.from_dict(conf.get("train") or {})
    threads = torch.get_num_threads()
    if tc.cpu_threads > 0:
        torch.set_num_threads(tc.cpu_threads)
    try:
        return _train(conf, tc, extra_summary)
    finally:
        torch.set_num_threads(threads)


def _train(conf: dict, tc: TrainConfig, extra_summary: Mapping[str, Any] | None) -> dict:
    wall_start = time.time()
    dist.init_distributed()
    rank, world, main = dist.rank(), dist.world_size(), dist.is_main()
    device = dist.device()
    # Every rank uses rank 0's output dir (under torchrun each rank resolves its own Hydra config).
    out = Path(dist.all_gather_object(str(conf["output_dir"]))[0])
    seed = int(conf.get("seed", 42))
    if tc.deterministic:
        _set_deterministic()
    seed_everything(seed)  # before building: a projection layer is initialised from the global RNG

    paths = DatasetPaths(Path(conf["data_dir"]) / conf["data"]["name"])
    if not paths.train.is_file():
        raise FileNotFoundError(f"{paths.train}: no training data (prepare it with dpr-data data={conf['data']['name']})")
    train_examples = load_examples(paths.train)
    dev_examples = load_examples(paths.dev) if tc.validate and paths.dev.is_file() else []
    if tc.validate and not dev_examples:
        log.warning("%s: no dev examples: no validation, the final weights are the last step's", paths.dev)
    kind = conf["data"].get("kind") or paths.kind

    model_cfg = dict(conf["model"])
    model, tokenizer = load_biencoder(model_cfg.pop("name"), **model_cfg)
    model.to(device).train()
    mcfg = model.config
    precision = resolve_precision(tc.precision, device)
    autocast = _autocast(precision, device)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

    batches = TrainBatches(
        train_examples, tokenizer, batch_size=tc.batch_size, hard_negatives=tc.hard_negatives,
        question_max_length=mcfg.question_max_length, passage_max_length=mcfg.passage_max_length,
        seed=seed, rank=rank, world_size=world, shuffle=tc.shuffle, shuffle_positives=tc.shuffle_positives,
        shuffle_hard_negatives=tc.shuffle_hard_negatives, dedup_positives=tc.dedup_positives,
    )
    accum = tc.grad_accumulation_steps
    total = _total_steps(batches, tc)
    if batches.num_batches(0) < accum:
        raise ValueError(
            f"{paths.train}: {len(train_examples)} examples make {batches.num_batches(0)} global batches of "
            f"{tc.batch_size * world}, fewer than grad_accumulation_steps={accum}: lower train.batch_size"
            + (" (or set train.dedup_positives=false: many questions share a positive)" if tc.dedup_positives else "")
        )
    optimizer = build_optimizer(model, tc.lr, tc.weight_decay, tuple(tc.adam_betas), tc.adam_eps)
    scheduler = linear_schedule(optimizer, resolve_warmup(tc.warmup_steps, tc.warmup_ratio, total), total)

    fingerprint = ckpt.run_fingerprint(conf, dataclasses.asdict(tc), paths.train, world)
    state = _State(fingerprint=fingerprint)
    resume_dir = ckpt.resolve_resume(tc.resume, out)
    if resume_dir is not None and ckpt.read_state(resume_dir).get("fingerprint") != fingerprint:
        if str(tc.resume).lower() != "auto":
            raise ValueError(f"{resume_dir} was written with another model/data/train config; "
                             "train.resume=false starts over")
        log.warning("ignoring checkpoints in %s: written with another model/data/train config (starting over)", out)
        resume_dir = None
    if resume_dir is not None:
        saved, rngs = ckpt.load_checkpoint(resume_dir, model, optimizer, scheduler, scaler, map_location=device)
        state = _State(**{k: v for k, v in saved.items() if k in {f.name for f in dataclasses.fields(_State)}})
        ckpt.set_rng_state(rngs[rank % len(rngs)])
        log.info("resumed from %s (step %d, epoch %d, batch %d)", resume_dir, state.step, state.epoch, state.batch_in_epoch)
    else:
        if main and (out / ckpt.CHECKPOINT_DIR).is_dir():
            # a fresh run: an older run's checkpoints (or best weights) must never be resumed or restored
            shutil.rmtree(out / ckpt.CHECKPOINT_DIR)
        dist.barrier()
        seed_everything(seed + rank)  # ranks draw different dropout masks

    train_model: torch.nn.Module = model
    if dist.is_distributed():
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False
        )
    logger_cfg = dict(conf.get("logger") or {})
    logger = MetricsLogger(
        out, enabled=main, run_config=conf, resume_step=state.step,
        wandb_cfg=logger_cfg if logger_cfg.get("type") == "wandb" else None,
    )
    corpus = None
    if dev_examples and tc.val_corpus_topk:
        corpus = load_corpus(paths.passages, tc.val_corpus_max_passages) if paths.passages.is_file() else None
    val_autocast = "off" if precision == "fp32" else precision
    micro_outputs: list = []
    loss_fn = make_loss_fn(model, 1 + tc.hard_negatives, accum, scaler, micro_outputs)
    step_fn = make_step(tc.grad_cache_chunk_size)
    crash_at = int(os.environ.get(CRASH_ENV, "0") or 0)
    log.info(
        "training %d steps: %d examples, global batch %d (%d per device x %d) x %d accumulation, H=%d, precision %s",
        total, len(train_examples), tc.batch_size * world, tc.batch_size, world, accum, tc.hard_negatives, precision,
    )
    pbar = tqdm(total=total, initial=state.step, desc="train", unit="step", disable=not main, dynamic_ncols=True)

    def run_validation() -> None:
        metrics = validate(
            model, tokenizer, dev_examples, corpus=corpus, use_answers=kind == "qa", cfg=dataclasses.asdict(tc),
            question_max_length=mcfg.question_max_length, passage_max_length=mcfg.passage_max_length,
            autocast=val_autocast,
        )
        metrics["epoch"] = state.epoch
        state.last_validation = metrics
        logger.log_validation(state.step, metrics)
        log.info("validation at step %d: %s", state.step, _fmt(metrics))
        metric = tc.best_metric if tc.best_metric in metrics else "avg_rank"
        if _is_better(metric, metrics[metric], state.best_value):
            state.best_value, state.best_step, state.best_validation = float(metrics[metric]), state.step, metrics
            if main:
                ckpt.save_best(out, model, {"step": state.step, "metric": metric, "value": metrics[metric], "validation": metrics})

    try:
        if dev_examples and tc.validate_at_start and state.step == 0:
            # the starting weights compete for "best" too: training that hurts dev never wins
            run_validation()
            state.initial_validation = state.last_validation
        while state.step < total:
            num_batches = batches.num_batches(state.epoch)
            it = batches.iter_epoch(state.epoch, start=state.batch_in_epoch)
            while state.batch_in_epoch + accum <= num_batches and state.step < total:
                started = time.perf_counter()
                micro_outputs.clear()
                micro = [next(it)[1:] for _ in range(accum)]
                lr, grad_norm = optimizer_step(train_model, micro, step_fn=step_fn, loss_fn=loss_fn, autocast=autocast,
                                               optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                               max_grad_norm=tc.max_grad_norm, device=device)
                state.step += 1
                state.batch_in_epoch += accum
                epoch_done = state.batch_in_epoch + accum > num_batches
                if epoch_done:
                    state.epoch, state.batch_in_epoch = state.epoch + 1, 0
                seconds = time.perf_counter() - started
                state.train_seconds += seconds

                if state.step % tc.log_every == 0 or state.step == total or state.step % tc.print_every == 0:
                    row = _step_row(micro_outputs, lr, grad_norm, tc.batch_size * world * accum / seconds,
                                    state.epoch + state.batch_in_epoch / max(1, num_batches))
                    state.last_train = row
                    if state.step % tc.log_every == 0 or state.step == total:
                        logger.log_train(state.step, row)
                    if state.step % tc.print_every == 0:
                        log.info("step %d/%d: %s", state.step, total, _fmt(row))
                    pbar.set_postfix(loss=f"{row['loss']:.4f}", acc=f"{row['accuracy']:.2f}", lr=f"{lr:.2e}",
                                     ex_s=f"{row['examples_per_s']:.1f}", refresh=False)
                pbar.update(1)

                if dev_examples and (epoch_done or state.step == total or (tc.eval_every and state.step % tc.eval_every == 0)):
                    run_validation()
                if tc.save_every > 0 and (state.step % tc.save_every == 0 or state.step == total):
                    rngs = dist.all_gather_object(ckpt.rng_state())
                    if main:
                        ckpt.save_checkpoint(out, state.step, model, optimizer, scheduler, scaler,
                                             dataclasses.asdict(state), rngs, keep=tc.keep_checkpoints)
                    dist.barrier()
                if crash_at and state.step == crash_at:
                    raise RuntimeError(f"{CRASH_ENV}={crash_at}: simulated crash after step {crash_at}")
                if epoch_done:
                    break
    except BaseException:
        logger.close()  # flush what was logged (and finish a wandb run) before the error propagates
        raise
    finally:
        pbar.close()

    info = {"resumed_from": str(resume_dir) if resume_dir else None, **dict(extra_summary or {})}
    summary = _finish(out, model, tokenizer, state, tc, conf, main, precision, world, wall_start, info)
    logger.summary({"best_step": state.best_step, **summary["final_metrics"]})
    logger.close()
    dist.barrier()
    return summary


def _finish(out, model, tokenizer, state: _State, tc: TrainConfig, conf: dict, main: bool, precision: str,
            world: int, wall_start: float, extra: Mapping[str, Any] | None) -> dict:
    """Save the best (or, without validation, the last) weights to ``out`` and write the summary."""
    final_from = "last"
    best = ckpt.read_best(out) if state.best_step is not None else None
    if best is not None and best.get("step") == state.best_step:
        if main:
            ckpt.load_best(out, model, map_location=str(next(model.parameters()).device))
        final_from = f"best (step {state.best_step}, {best['metric']}={best['value']:.4g})"
    final_metrics = {k: v for k, v in state.last_train.items() if k in ("loss", "accuracy", "avg_rank")}
    final_metrics.update({f"val_{k}": v for k, v in state.best_validation.items() if k != "epoch"})
    examples = state.step * tc.batch_size * world * tc.grad_accumulation_steps
    summary = {
        "output_dir": str(out),
        "steps": state.step,
        "epoch": state.epoch,
        "batch_in_epoch": state.batch_in_epoch,
        "best_step": state.best_step,
        "best_metric": {"name": tc.best_metric, "value": state.best_value},
        "final_weights": final_from,
        "final_metrics": final_metrics,
        "initial_validation": state.initial_validation,
        "last_validation": state.last_validation,
        "precision": precision,
        "world_size": world,
        "train_seconds": round(state.train_seconds, 3),
        "examples_per_s": examples / state.train_seconds if state.train_seconds else None,
        "wall_time_s": round(time.time() - wall_start, 3),
        "config": conf,
        **dict(extra or {}),
    }
    if main:
        save_biencoder(model, tokenizer, out)
        write_json_atomic(out / "train_summary.json", summary)
        log.info("saved %s weights to %s", final_from, out)
    return summary


def _step_row(outputs: list, lr: float, grad_norm: float, examples_per_s: float, epoch: float) -> dict:
    """One metrics.jsonl row: the step's micro-batch losses and in-batch ranks, averaged over ranks."""
    return {
        "loss": dist.reduce_mean(torch.stack([o.loss.detach() for o in outputs]).mean()),
        "accuracy": dist.reduce_mean(float(np.mean([o.accuracy for o in outputs]))),
        "avg_rank": dist.reduce_mean(float(np.mean([o.avg_rank for o in outputs]))),
        "lr": lr,
        "grad_norm": grad_norm,
        "examples_per_s": examples_per_s,
        "epoch": epoch,
        "negatives": outputs[0].num_candidates - 1,  # candidates besides the positive, across ranks
    }


def _fmt(metrics: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
