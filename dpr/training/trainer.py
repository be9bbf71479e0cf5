"""The :class:`Trainer`: handed its model, loss, step, batches and validator; it owns the loop around them.

One optimizer step = ``grad_accumulation_steps`` micro-batches; steps ``< frozen_steps`` are frozen-index
steps (question tower only, against the cached corpus), the rest two-tower steps (plain or gradient
cache), optionally with corpus negatives. Validation runs at each epoch end, every ``eval_every`` steps
and at the last step (plus the start with ``validate_at_start``); the best weights by the validator's
primary metric are what ``<output_dir>/`` finally holds. Checkpoints every ``save_every`` steps (weights,
optimizer, scheduler, RNG states, data position and the cached corpus vectors) make a killed run
resumable to the same weights an uninterrupted run ends with.

Divergence stops the run: after every optimizer step the loss (averaged over ranks, so every rank agrees),
the gradient norm and the weights must be finite, else :class:`TrainingDiverged` (a ValueError: the CLI
prints one line naming the step, exit 2) is raised before that step is logged, validated, checkpointed or
saved. Non-finite weights are therefore never kept as best nor saved; the checkpoints of earlier steps stay.
With fp16 loss scaling an overflowing gradient is the scaler's business (it skips the step), not an error.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from tqdm.auto import tqdm

from dpr import distributed as dist
from dpr.training.config import TrainConfig
from dpr.training.corpus_negatives import CorpusNegatives
from dpr.training.batching import TrainBatches
from dpr.training.health import HealthWatch
from dpr.training.loader import batch_stream
from dpr.training.step_figures import stage
from dpr.training.steps import bind_loss, frozen_index_step, optimizer_step
from dpr.training.validation import Validator, greater_is_better
from dpr.trainkit import checkpoint as ckpt
from dpr.trainkit.metrics_log import MetricsLogger
from dpr.trainkit.seed import rng_state, set_rng_state

log = logging.getLogger(__name__)


class TrainingDiverged(ValueError):
    """The loss, the gradients or the weights stopped being finite: ``str()`` is one line naming the step."""


def nonfinite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters holding a NaN or an infinity; ``["<norm overflow>"]`` when all are finite
    but so large (|w| > ~1e19) that their fp32 norm overflows -- diverged all the same.

    Screened with one fused norm per tensor and one sync (~40 ms for MiniLM's two towers on one CPU core,
    against ~10x that for an element-wise isfinite); the exact check runs only when the screen trips.
    """
    named = [(n, p.detach()) for n, p in model.named_parameters()]
    if not named:
        return []
    norms = torch.stack([t.float() for t in torch._foreach_norm([p for _, p in named])])
    if bool(torch.isfinite(norms).all()):
        return []
    flags = torch.stack([torch.isfinite(p).all() for _, p in named]).cpu()
    return [n for (n, _), ok in zip(named, flags.tolist()) if not ok] or ["<norm overflow>"]


def check_step_finite(step: int, loss: float, grad_norm: float, model: torch.nn.Module, *, lr: float,
                      scaled: bool = False, weights: bool = True) -> None:
    """Raise :class:`TrainingDiverged` unless step ``step``'s loss, gradient norm and resulting weights are
    finite (``scaled``: fp16 loss scaling, where an overflowing gradient only makes the scaler skip the step;
    ``weights=False``: not the weights, which have moved on since that step)."""
    problem = None
    loss, grad_norm = float(loss), float(grad_norm)
    if not math.isfinite(loss):
        problem = f"the loss is {loss}"
    elif not math.isfinite(grad_norm) and not scaled:
        problem = f"the gradient norm is {grad_norm}"
    elif weights:
        bad = nonfinite_parameters(model)
        if bad == ["<norm overflow>"]:
            problem = "the weights' norm overflows fp32 (|w| > ~1e19)"
        elif bad:
            problem = f"{len(bad)} weight tensors are not finite (first: {bad[0]})"
    if problem:
        raise TrainingDiverged(f"training diverged at step {step}: {problem} (lr {lr:.3g}); nothing of this "
                               "step was saved: lower train.lr, keep train.max_grad_norm > 0, or check the data")


@dataclass
class TrainState:
    """Everything besides tensors that a checkpoint must carry (saved as state.json)."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_value: float | None = None
    best_step: int | None = None
    best_metric: str | None = None
    train_seconds: float = 0.0
    last_train: dict = field(default_factory=dict)
    last_validation: dict = field(default_factory=dict)
    best_validation: dict = field(default_factory=dict)
    initial_validation: dict = field(default_factory=dict)
    fingerprint: str = ""


@dataclass
class Trainer:
    """Runs the steps; what is trained how is decided by whoever builds it (:func:`dpr.training.train.train`)."""

    model: torch.nn.Module                 # the BiEncoder
    train_model: torch.nn.Module           # the same, or its DDP wrapper
    tokenizer: Any
    loss: Callable                         # a dpr.losses loss
    step_fn: Callable                      # steps.make_step: standard_step or a gradient-cache step (two-tower steps)
    batches: TrainBatches
    validator: Validator | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: Any
    tc: TrainConfig
    out: Path
    total_steps: int
    device: torch.device
    autocast: Any = None
    corpus: CorpusNegatives | None = None
    logger: MetricsLogger | None = None
    state: TrainState = field(default_factory=TrainState)
    encode_autocast: str = "off"
    start_vectors: torch.Tensor | None = None  # the corpus encoded by the starting weights (corpus_reuse)
    best_vectors: torch.Tensor | None = None   # the corpus encoded by the best weights, once validated here
    health: HealthWatch = field(default_factory=lambda: HealthWatch(enabled=dist.is_main()))  # warnings
    # steps not yet checked: (step, lr, grad norm, micro-batch losses, accuracies) as device tensors
    _pending: list = field(default_factory=list, repr=False)
    _staged: list = field(default_factory=list, repr=False)  # figures on their way to the host (lagged_logging)

    @property
    def main(self) -> bool:
        return dist.is_main()

    # ----------------------------------------------------------------- the loop
    def fit(self) -> TrainState:
        tc, st = self.tc, self.state
        pbar = tqdm(total=self.total_steps, initial=st.step, desc="train", unit="step", disable=not self.main,
                    dynamic_ncols=True)
        outputs: list = []
        try:
            if self.validator and tc.validate_at_start and st.step == 0:
                # the starting weights compete for "best" too: training that hurts dev never wins
                self.validate()
                st.initial_validation = st.last_validation
            self._ensure_corpus()
            while st.step < self.total_steps:
                frozen = st.step < tc.frozen_steps
                num_batches = self.batches.num_batches(st.epoch)
                it = batch_stream(self.batches, st.epoch, st.batch_in_epoch, not frozen, device=self.device,
                                  background=tc.background_loader is not False)
                try:
                    self._steps_of_epoch(it, num_batches, frozen, outputs, pbar)
                finally:
                    if hasattr(it, "close"):
                        it.close()  # stop the loader's thread: it may be building batches this loop will not take
        finally:
            pbar.close()
        return st

    def _steps_of_epoch(self, it, num_batches: int, frozen: bool, outputs: list, pbar) -> None:
        """Optimizer steps from ``it`` until the epoch or the phase (frozen-index / two-tower) ends."""
        tc, st = self.tc, self.state
        accum = tc.grad_accumulation_steps
        world = dist.world_size()
        while st.batch_in_epoch + accum <= num_batches and st.step < self.total_steps:
            if (st.step < tc.frozen_steps) != frozen:
                return  # the phase changed: re-open the epoch's iterator with (or without) passages
            started = time.perf_counter()
            data_wait = 0.0  # the training thread waiting for its batches (the loader's share left on it)
            outputs.clear()
            micro = []
            for _ in range(accum):
                waited = time.perf_counter()
                batch = next(it)
                data_wait += time.perf_counter() - waited
                fn = bind_loss(self.loss, self.model.similarity, batch, corpus=self.corpus if (
                    frozen or tc.corpus_negatives) else None, frozen=frozen, accum=accum,
                    scaler=self.scaler, outputs=outputs)
                micro.append((batch.q_inputs, batch.p_inputs, fn))
            lr, grad_norm = optimizer_step(
                self.train_model, micro, step_fn=frozen_index_step if frozen else self.step_fn,
                autocast=self.autocast, optimizer=self.optimizer, scheduler=self.scheduler,
                scaler=self.scaler, max_grad_norm=tc.max_grad_norm, device=self.device)
            st.step += 1
            # read back at the next logging interval, validation or checkpoint (flush_checks), not now: a
            # number read here would make the host wait for the device every step
            self._pending.append((st.step, lr, grad_norm, torch.stack([o.loss.detach().float() for o in outputs]),
                                  torch.stack([torch.as_tensor(o.accuracy, dtype=torch.float32) for o in outputs])))
            st.batch_in_epoch += accum
            epoch_done = st.batch_in_epoch + accum > num_batches
            if epoch_done:
                st.epoch, st.batch_in_epoch = st.epoch + 1, 0
            seconds = time.perf_counter() - started
            st.train_seconds += seconds
            self._log_step(outputs, lr, tc.batch_size * world * accum / seconds,
                           st.epoch + st.batch_in_epoch / max(1, num_batches), frozen, pbar, data_wait)
            pbar.update(1)
            if self.validator and (epoch_done or st.step == self.total_steps
                                   or (tc.eval_every and st.step % tc.eval_every == 0)):
                self.validate()
            if tc.corpus_refresh_every and st.step % tc.corpus_refresh_every == 0 and self._needs_corpus(st.step):
                self.refresh_corpus()
            if tc.save_every > 0 and (st.step % tc.save_every == 0 or st.step == self.total_steps):
                self.save_checkpoint()
            if epoch_done:
                return

    # ----------------------------------------------------------------- pieces
    def flush_checks(self, lagged: bool = False, row: tuple | None = None) -> None:
        """The finiteness check and the health watch of every step since the last call, in step order, and the rows
        waiting to be logged, from one read of the device (one all-reduce under DDP): before anything is validated
        or saved, so a diverged step is still never written (:func:`check_step_finite`). ``lagged`` (a CUDA logging
        interval): the figures of the steps up to now are only started on their way to the host
        (:func:`~dpr.training.step_figures.stage`) and those of the interval before are checked and written: they
        are ready while the device works on the steps since; the weights are checked at the next full flush.
        ``row``: the arguments of the logged step's metrics.jsonl row (:meth:`_write_row`), written with its figures."""
        rows = [row] if row is not None else []
        staged = stage(self._pending, rows) if self._pending or rows else None
        self._pending = []
        queue = self._staged + ([staged] if staged else [])
        self._staged, queue = (queue[-1:], queue[:-1]) if lagged and queue else ([], queue)
        last = None if lagged else max((c[0] for s in queue for c in s.checks), default=None)
        for s in queue:
            s.wait()
            for step, lr, loss, mean_loss, accuracy, grad_norm in s.checks:
                check_step_finite(step, float(loss), float(grad_norm), self.model, lr=lr,
                                  scaled=self.scaler.is_enabled(), weights=step == last)
                self.health.after_step(step, float(mean_loss), float(accuracy))
            for row, figures, grad_norm in s.rows:
                self._write_row(row, figures, grad_norm)

    def _needs_corpus(self, step: int) -> bool:
        return self.corpus is not None and (step < self.tc.frozen_steps or self.tc.corpus_negatives)

    def _ensure_corpus(self) -> None:
        if self._needs_corpus(self.state.step) and self.corpus.vectors is None:
            if self.state.step == 0 and self.start_vectors is not None:
                self.corpus.set_vectors(self.corpus.of_file(self.start_vectors), 0)  # a sample: its rows
            else:
                self.refresh_corpus()

    def refresh_corpus(self) -> None:
        mcfg = self.model.config
        tokens = self.validator.tokens.get("corpus") if self.validator else None  # the same passages' ids
        self.corpus.refresh(self.model, self.tokenizer, step=self.state.step, batch_size=self.tc.val_batch_size,
                            max_length=mcfg.passage_max_length, autocast=self.encode_autocast, tokens=tokens)

    def _passages_unchanged(self) -> bool:
        """The cached corpus vectors are the current passage tower's: only frozen-index steps (separate
        towers) ran since they were encoded, and the validator would encode the same corpus."""
        c, st = self.corpus, self.state
        return (c is not None and c.vectors is not None and not self.model.config.shared
                and st.step <= self.tc.frozen_steps and self._same_corpus())

    def _same_corpus(self) -> bool:
        """Validation ranks the cached corpus's passages (not so with train.corpus_sample)."""
        v = self.validator.corpus if self.validator else None
        return (v is not None and self.corpus is not None and len(v[0]) == len(self.corpus.ids)
                and list(v[0]) == self.corpus.ids)

    def validate(self) -> None:
        self.flush_checks()
        st = self.state
        known = self.corpus.whole_vectors() if self._passages_unchanged() else None
        if known is None and st.step == 0 and self.start_vectors is not None and self.validator.corpus is not None:
            known = self.start_vectors
        metrics, corpus_vectors = self.validator(self.model, passage_vectors=known)
        if corpus_vectors is not None and self._same_corpus():
            self.corpus.set_vectors(corpus_vectors, st.step)  # the current weights' corpus: reuse it
        metrics["epoch"] = st.epoch
        st.last_validation = metrics
        if self.logger:
            self.logger.log_validation(st.step, metrics)
        log.info("validation at step %d: %s", st.step, fmt(metrics))
        metric = self.validator.metric(metrics)
        start = st.initial_validation.get(metric) if st.step > 0 else None
        self.health.after_validation(st.step, st.epoch, metric, float(metrics[metric]), start,
                                     greater_is_better(metric))
        if self.validator.is_better(metric, metrics[metric], st.best_value):
            st.best_value, st.best_step, st.best_metric, st.best_validation = (
                float(metrics[metric]), st.step, metric, metrics)
            self.best_vectors = corpus_vectors
            if self.main:
                ckpt.save_best(self.out, self.model, {"step": st.step, "metric": metric, "value": metrics[metric],
                                                      "validation": metrics})

    def save_checkpoint(self) -> None:
        self.flush_checks()
        rngs = dist.all_gather_object(rng_state())
        if self.main:
            extra = {}
            if self.corpus is not None and self.corpus.vectors is not None and self.corpus.checkpointed:
                extra = {"corpus_vectors": self.corpus.vectors,
                         "corpus_version": torch.tensor([self.corpus.version])}
            ckpt.save_checkpoint(self.out, self.state.step, self.model, self.optimizer, self.scheduler, self.scaler,
                                 dataclasses.asdict(self.state), rngs, keep=self.tc.keep_checkpoints,
                                 extra_tensors=extra)
        dist.barrier()

    def restore(self, resume_dir: Path) -> None:
        saved, rngs = ckpt.load_checkpoint(resume_dir, self.model, self.optimizer, self.scheduler, self.scaler,
                                           map_location=self.device)
        names = {f.name for f in dataclasses.fields(TrainState)}
        self.state = TrainState(**{k: v for k, v in saved.items() if k in names})
        extra = ckpt.load_extra(resume_dir)
        if self.corpus is not None and "corpus_vectors" in extra:
            self.corpus.set_vectors(extra["corpus_vectors"], int(extra["corpus_version"][0]))
        set_rng_state(rngs[dist.rank() % len(rngs)])
        st = self.state
        log.info("resumed from %s (step %d, epoch %d, batch %d)", resume_dir, st.step, st.epoch, st.batch_in_epoch)

    def _log_step(self, outputs: list, lr: float, examples_per_s: float, epoch: float, frozen: bool, pbar,
                  data_wait: float = 0.0) -> None:
        tc, st = self.tc, self.state
        if not (st.step % tc.log_every == 0 or st.step == self.total_steps or st.step % tc.print_every == 0):
            return
        # on a CUDA device this step's row is written at the next logging interval (or validation, checkpoint, the
        # last step): reading it now would drain the device's queue every interval
        self.flush_checks(lagged=lagged_logging(self.device) and st.step != self.total_steps,
                          row=(st.step, list(outputs), lr, examples_per_s, epoch, frozen, data_wait, pbar))

    def _write_row(self, args: tuple, figures: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """One metrics.jsonl row from ``args`` (:meth:`_log_step`'s) and its staged figures, on the host."""
        tc, st = self.tc, self.state
        step, outputs, lr, examples_per_s, epoch, frozen, data_wait, pbar = args
        loss, accuracy, avg_rank, masked = (float(v) for v in figures)
        row = {"loss": loss, "accuracy": accuracy, "avg_rank": avg_rank, "lr": lr, "grad_norm": float(grad_norm),
               "examples_per_s": examples_per_s, "epoch": epoch,
               "negatives": outputs[0].num_candidates - 1,  # candidates besides the positive, across ranks
               "masked": masked,  # false-negative pairs removed
               "frozen": frozen, "data_wait_ms": round(1e3 * data_wait, 3)}
        st.last_train = row
        if self.logger and (step % tc.log_every == 0 or step == self.total_steps):
            self.logger.log_train(step, row)
        if step % tc.print_every == 0:
            log.info("step %d/%d: %s", step, self.total_steps, fmt(row))
        pbar.set_postfix(loss=f"{loss:.4f}", acc=f"{accuracy:.2f}", lr=f"{lr:.2e}",
                         ex_s=f"{examples_per_s:.1f}", refresh=False)


def lagged_logging(device: torch.device) -> bool:
    """Whether a logging interval writes the rows of the interval before instead of its own, whose figures it only
    starts on their way to the host (:mod:`dpr.training.step_figures`): on a CUDA device, where reading the step just
    queued would make the host wait for the device to finish it, so the next step would not be queued while it
    computes. The rows are the same; only when they are written moves."""
    return torch.device(device).type == "cuda"


def fmt(metrics: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
