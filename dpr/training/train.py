"""``train(cfg) -> summary``: builds the pieces a :class:`~dpr.training.trainer.Trainer` is handed, runs it,
and saves the best weights -- a plain function over a config mapping (Hydra lives in dpr.cli).

``cfg`` has ``model`` (BiEncoderConfig keys), ``data`` (``name``, ``kind``), ``train``
(:class:`~dpr.training.config.TrainConfig`), ``loss`` (``_target_`` + the loss's keys, see conf/loss/;
default: DPR's softmax NLL), ``logger`` (``type: none|wandb``), ``data_dir``, ``output_dir`` and ``seed``.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

import torch
from omegaconf import DictConfig

from dpr import distributed as dist
from dpr.atomic import write_json_atomic
from dpr.data.dataset import DatasetPaths
from dpr.losses import build_loss
from dpr.model_card import write_model_card
from dpr.models import load_biencoder, save_biencoder
from dpr.models.backbone import check_trainable_dtype
from dpr.models.pooling import check_not_collapsed
from dpr.models.dropout import set_attention_dropout
from dpr.models.freeze import freeze_bottom_layers
from dpr.perf.malloc import keep_freed_memory
from dpr.run_dir import data_fingerprints
from dpr.training.config import TrainConfig
from dpr.training.corpus_negatives import CorpusNegatives
from dpr.training.corpus_reuse import CorpusVectors, OnSaved, check_start_vectors
from dpr.training.batching import Shard, TrainBatches, load_examples
from dpr.training.example_file import ExampleFile
from dpr.training.steps import make_step
from dpr.training.train_tokens import train_tokens, validation_tokens
from dpr.training.trainer import Trainer, TrainState
from dpr.training.resume import find_resume, lora_base_fingerprint, run_fingerprint
from dpr.training.teacher import RunTeacher, prepare_teacher
from dpr.training.validation import DevEncoding, Validator, load_corpus
from dpr.trainkit import checkpoint as ckpt
from dpr.trainkit.config_dict import plain
from dpr.trainkit.metrics_log import MetricsLogger
from dpr.trainkit.optim import build_optimizer, phased_schedule
from dpr.trainkit.precision import autocast_factory, resolve_precision
from dpr.trainkit.seed import seed_everything, use_deterministic_algorithms

log = logging.getLogger(__name__)

__all__ = ["TrainConfig", "train"]


def _total_steps(batches: TrainBatches, tc: TrainConfig) -> int:
    if tc.max_steps > 0:
        return int(tc.max_steps) + int(tc.frozen_steps)
    return sum(batches.num_batches(e) // tc.grad_accumulation_steps for e in range(tc.epochs)) + int(tc.frozen_steps)


def train(cfg: Mapping[str, Any] | DictConfig, extra_summary: Mapping[str, Any] | None = None, *,
          start_vectors: CorpusVectors | None = None, on_saved: OnSaved | None = None) -> dict:
    """Train a bi-encoder; returns (and writes to ``<output_dir>/train_summary.json``) the run summary.

    ``start_vectors``: ``(ids, vectors)``, or an embeddings directory, of the corpus encoded by the starting
    weights, used instead of encoding it at step 0 (read only then, and checked; see
    :mod:`dpr.training.corpus_reuse`); ``on_saved(model_dir, ids,
    vectors, computed_with=...)`` receives the corpus vectors of the saved weights when this run encoded them.
    """
    conf = plain(cfg)
    tc = TrainConfig.from_dict(conf.get("train") or {})
    keep_freed_memory()  # no page-fault storm per step on the CPU (dpr/perf/malloc.py)
    threads = torch.get_num_threads()
    if tc.cpu_threads > 0:
        torch.set_num_threads(tc.cpu_threads)
    try:
        return _train(conf, tc, extra_summary, start_vectors, on_saved)
    finally:
        torch.set_num_threads(threads)


@dataclasses.dataclass(frozen=True)
class _Run:
    """Where and as what this process trains (fixed before anything is built)."""

    conf: dict
    tc: TrainConfig
    out: Path
    seed: int
    rank: int
    world: int
    main: bool
    device: torch.device


@dataclasses.dataclass(frozen=True)
class _Data:
    """The run's data: its files, examples (the loss's teacher may replace the training ones), its kind (qa |
    qrels) and what the "auto" settings become for it (also in the summary and the model card)."""

    paths: DatasetPaths
    train_file: Path
    train_examples: Any
    dev_examples: list
    kind: str
    resolved: dict


def _train(conf: dict, tc: TrainConfig, extra_summary: Mapping[str, Any] | None,
           start_vectors: CorpusVectors | None, on_saved: OnSaved | None) -> dict:
    wall_start = time.time()
    run = _start(conf, tc)
    data = _read_data(conf, tc)
    model, tokenizer = _build_model(run)
    mcfg = model.config
    precision = resolve_precision(tc.precision, run.device, training=True)
    scaler = torch.amp.GradScaler(run.device.type, enabled=precision == "fp16")
    loss, run_teacher = _loss(run, data)
    data = dataclasses.replace(data, train_examples=run_teacher.examples)
    batches, total = _batches(run, data, tokenizer, mcfg, run_teacher.teacher)
    optimizer = build_optimizer(model, tc.lr, tc.weight_decay, tuple(tc.adam_betas), tc.adam_eps, tc.optimizer_impl)
    # one warm-up/decay per phase: the frozen-index steps, then the two-tower steps
    scheduler = phased_schedule(optimizer, [tc.frozen_steps, total - tc.frozen_steps], tc.warmup_steps, tc.warmup_ratio)
    corpus_texts, corpus = _corpus_negatives(run, data, run_teacher.teacher)
    val_autocast = "off" if precision == "fp32" else precision
    validator = _validator(run, data, tokenizer, mcfg, corpus_texts, val_autocast)
    fingerprint = run_fingerprint({**conf, "loss": conf.get("loss")},
                                  {**dataclasses.asdict(tc), **run_teacher.fingerprint}, data.train_file, run.world)
    resume_dir = find_resume(tc.resume, run.out, fingerprint,
                             lora_base_fingerprint(conf["model"]["name"], conf["model"].get("lora")))
    trainer = Trainer(
        model=model, train_model=_train_model(run, model, tokenizer, data.train_examples, resume_dir),
        tokenizer=tokenizer, loss=loss, step_fn=make_step(tc.grad_cache_chunk_size, tc.bucket_size_for(run.device)),
        batches=batches, validator=validator, optimizer=optimizer, scheduler=scheduler, scaler=scaler, tc=tc,
        out=run.out, total_steps=total, device=run.device, autocast=autocast_factory(run.device, precision),
        corpus=corpus, state=TrainState(fingerprint=fingerprint), encode_autocast=val_autocast,
    )
    _begin(run, trainer, corpus_texts, start_vectors, resume_dir)
    log.info(
        "training %d steps (%d frozen-index): %d examples, global batch %d (%d per device x %d) x %d accumulation, "
        "H=%d, loss %s, corpus negatives %s, precision %s", total, tc.frozen_steps, len(data.train_examples),
        tc.batch_size * run.world, tc.batch_size, run.world, tc.grad_accumulation_steps, tc.hard_negatives,
        type(loss).__name__, tc.corpus_negatives, precision,
    )
    try:
        state = trainer.fit()
    except BaseException:
        trainer.logger.close()  # flush what was logged (and finish a wandb run) before the error propagates
        raise
    # the run's data as dpr.run_dir compares it (another train_file= into this finished run is another run)
    info = {"resumed_from": str(resume_dir) if resume_dir else None,
            "data_fingerprints": data_fingerprints(data.train_file, data.paths.dev), **dict(extra_summary or {})}
    check_not_collapsed(model, tokenizer, data.train_examples, str(run.out))  # before the run is called done
    summary = _finish(run, model, tokenizer, state, precision, wall_start, info, resolved=data.resolved)
    if run.main and on_saved is not None and trainer.best_vectors is not None and summary["final_weights"] != "last":
        on_saved(run.out, corpus_texts[0], trainer.best_vectors, computed_with={
            "device": str(run.device), "autocast": val_autocast, "max_length": mcfg.passage_max_length})
    trainer.logger.summary({"best_step": state.best_step, **summary["final_metrics"]})
    trainer.logger.close()
    dist.barrier()
    return summary


def _start(conf: dict, tc: TrainConfig) -> _Run:
    """Join the process group, agree on the output directory and seed the global RNGs."""
    dist.init_distributed()
    rank, world, main = dist.rank(), dist.world_size(), dist.is_main()
    device = dist.device()
    # Every rank uses rank 0's output dir (under torchrun each rank resolves its own Hydra config).
    out = Path(dist.all_gather_object(str(conf["output_dir"]))[0])
    seed = int(conf.get("seed", 42))
    if tc.deterministic:
        use_deterministic_algorithms()
    seed_everything(seed)  # before building: a projection layer is initialised from the global RNG
    return _Run(conf, tc, out, seed, rank, world, main, device)


def _read_data(conf: dict, tc: TrainConfig) -> _Data:
    paths = DatasetPaths(Path(conf["data_dir"]) / conf["data"]["name"])
    train_file = Path(conf.get("train_file") or paths.train)  # re-mining rounds train on their own file
    if not train_file.is_file():
        raise FileNotFoundError(f"{train_file}: no training data (prepare it with dpr-data data={conf['data']['name']})")
    # streamed: byte offsets and a few ids per question; each record parsed when a batch needs it
    train_examples = ExampleFile(train_file, other_negatives=tc.other_negatives is not False)
    dev_examples = load_examples(paths.dev) if tc.validate and paths.dev.is_file() else []
    if tc.validate and not dev_examples:
        log.warning("%s: no dev examples: no validation, the final weights are the last step's", paths.dev)
    kind = conf["data"].get("kind") or paths.kind
    resolved = {"multi_positive": tc.multi_positive_for(kind), "best_metric": tc.best_metric_for(kind)}
    return _Data(paths, train_file, train_examples, dev_examples, kind, resolved)


def _build_model(run: _Run) -> tuple[Any, Any]:
    """The bi-encoder and its tokenizer on the run's device, in training mode, with the run's dropout and frozen
    layers."""
    tc, model_cfg = run.tc, dict(run.conf["model"])
    check_trainable_dtype(model_cfg.get("dtype", "fp32"), model_cfg.get("lora"))
    model, tokenizer = load_biencoder(model_cfg.pop("name"), **model_cfg)
    model.to(run.device).train()
    if tc.attention_dropout is not None:  # on the modules: the saved config.json keeps the model's own value
        n = set_attention_dropout(model, tc.attention_dropout)
        log.info("attention dropout %g in %d attention modules (training only)", tc.attention_dropout, n)
    if tc.passage_frozen_layers:
        if model.config.shared:
            raise ValueError("train.passage_frozen_layers needs separate towers (model.shared=false): "
                             "in a shared tower it would freeze the question side too")
        frozen = freeze_bottom_layers(model.passage_encoder, tc.passage_frozen_layers)
        log.info("passage tower: embeddings and the first %d layers frozen (%d parameters)",
                 tc.passage_frozen_layers, frozen)
    return model, tokenizer


def _loss(run: _Run, data: _Data) -> tuple[Any, RunTeacher]:
    """The loss (over nested prefixes of the vectors with ``train.matryoshka_dims``) and its teacher (BM25 or a
    scores file) with, under ``train.teacher_denoise``, the denoised examples."""
    tc = run.tc
    loss = build_loss(run.conf.get("loss"))
    if tc.matryoshka_dims:
        from dpr.losses.matryoshka import MatryoshkaLoss

        loss = MatryoshkaLoss(loss, tc.matryoshka_dims, tc.matryoshka_weights, tc.matryoshka_distill)
    run_teacher = prepare_teacher(loss, tc, data.paths.root, data.paths.passages, data.train_file, data.train_examples,
                                  write_counts=run.main,
                                  bm25=run.conf.get("bm25"))  # the run's bm25.* (BM25Config): the BM25 teacher's index
    return loss, run_teacher


def _batches(run: _Run, data: _Data, tokenizer: Any, mcfg: Any, teacher: Any) -> tuple[TrainBatches, int]:
    """This rank's batches and the run's total optimizer steps; refuses data too small for one step."""
    tc, examples = run.tc, data.train_examples
    tokens = None
    if tc.token_cache is not False:  # tokenised once, cached beside the file (rank 0 writes it)
        tokens = train_tokens(examples, tokenizer, data.train_file, question_max_length=mcfg.question_max_length,
                              passage_max_length=mcfg.passage_max_length, question_prefix=mcfg.question_prefix,
                              passage_prefix=mcfg.passage_prefix, write=run.main)
    batches = TrainBatches(examples, tokenizer, tc, mcfg, seed=run.seed, shard=Shard(run.rank, run.world),
                           multi_positive=data.resolved["multi_positive"],
                           mask_answers=tc.mask_answers and data.kind == "qa", teacher=teacher, tokens=tokens)
    accum = tc.grad_accumulation_steps
    total = _total_steps(batches, tc)
    if batches.num_batches(0) < accum:
        raise ValueError(
            f"{data.train_file}: {len(examples)} examples make {batches.num_batches(0)} global batches of "
            f"{tc.batch_size * run.world}, fewer than grad_accumulation_steps={accum}: lower train.batch_size"
            + (" (or set train.dedup_positives=false: many questions share a positive)" if tc.dedup_positives else "")
        )
    return batches, total


def _corpus_negatives(run: _Run, data: _Data, teacher: Any) -> tuple[tuple | None, CorpusNegatives | None]:
    """``(validation corpus, corpus negatives)`` (each None when off): see :func:`_corpus`."""
    tc = run.tc
    needs_corpus = tc.frozen_steps > 0 or tc.corpus_negatives
    corpus_texts, cached = _corpus(data.paths, tc, needs_corpus, bool(data.dev_examples), data.train_examples, run.seed)
    if cached is None:
        return corpus_texts, None
    return corpus_texts, CorpusNegatives(*cached[:3], positions=cached[3], max_corpus=tc.corpus_max_passages,
                                         topk=tc.corpus_topk, multi_positive=data.resolved["multi_positive"],
                                         mask_answers=tc.mask_answers and data.kind == "qa", teacher=teacher,
                                         checkpointed=cached[3] is None)


def _validator(run: _Run, data: _Data, tokenizer: Any, mcfg: Any, corpus_texts: tuple | None,
               autocast: str) -> Validator | None:
    """The dev validation (None without dev examples)."""
    if not data.dev_examples:
        return None
    tc = run.tc
    return Validator(tokenizer, data.dev_examples, corpus=corpus_texts if tc.val_corpus_topk else None,
                     use_answers=data.kind == "qa", cfg=tc,
                     encoding=DevEncoding(question_max_length=mcfg.question_max_length,
                                          passage_max_length=mcfg.passage_max_length, autocast=autocast),
                     primary_metric=data.resolved["best_metric"],
                     tokens=validation_tokens(tc, tokenizer, mcfg, data.paths, data.dev_examples, corpus_texts,
                                              run.main))


def _train_model(run: _Run, model: Any, tokenizer: Any, examples: Any, resume_dir: Path | None) -> torch.nn.Module:
    """The module the steps run: the model (its projection PCA-initialised with ``train.projection_init`` on a
    fresh run), wrapped in DDP under torchrun."""
    tc, device = run.tc, run.device
    if tc.projection_init and resume_dir is None:  # before DDP, which broadcasts rank 0's weights
        from dpr.training.projection_init import init_projection_pca

        init_projection_pca(model, tokenizer, examples, device=device)
    if not dist.is_distributed():
        return model
    from torch.nn.parallel import DistributedDataParallel

    # frozen-index steps leave the passage tower unused (separate towers)
    unused = tc.frozen_steps > 0 and not model.config.shared
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   broadcast_buffers=False, find_unused_parameters=unused)


def _begin(run: _Run, trainer: Trainer, corpus_texts: tuple | None, start_vectors: CorpusVectors | None,
           resume_dir: Path | None) -> None:
    """The trainer's starting point: the given start vectors (checked), a checkpoint to resume, or a fresh start
    (an older run's checkpoints removed, each rank its own dropout seed); then its metrics logger."""
    tc, out = run.tc, run.out
    if start_vectors is not None and tc.projection_init:  # encoded by the weights before the projection was set
        log.info("projection_init: the given start vectors are not this run's starting weights; not used")
        start_vectors = None
    if start_vectors is not None and corpus_texts is not None and resume_dir is None:
        trainer.start_vectors = check_start_vectors(trainer.model, trainer.tokenizer, corpus_texts, start_vectors,
                                                    max_length=trainer.model.config.passage_max_length,
                                                    autocast=trainer.encode_autocast)
    if resume_dir is not None:
        trainer.restore(resume_dir)
    else:
        if run.main and (out / ckpt.CHECKPOINT_DIR).is_dir():
            # a fresh run: an older run's checkpoints (or best weights) must never be resumed or restored
            shutil.rmtree(out / ckpt.CHECKPOINT_DIR)
        dist.barrier()
        seed_everything(run.seed + run.rank)  # ranks draw different dropout masks
    logger_cfg = dict(run.conf.get("logger") or {})
    trainer.logger = MetricsLogger(out, enabled=run.main, run_config=run.conf, resume_step=trainer.state.step,
                                   wandb_cfg=logger_cfg if logger_cfg.get("type") == "wandb" else None)


def _corpus(paths: DatasetPaths, tc: TrainConfig, needs_corpus: bool, validates: bool, train_examples: Any,
            seed: int) -> tuple[tuple[list[str], list[str], list[str]] | None, tuple | None]:
    """``(validation corpus, cached corpus)``: the passages validation ranks (None: no corpus top-k) and the ones the
    frozen-index steps and corpus negatives score against, as ``(ids, texts, titles, rows in the file or None)``
    (None: neither is on). Without ``train.corpus_sample`` (and a corpus of at most
    :data:`~dpr.training.corpus_sample.WHOLE_CORPUS_MAX` passages) both are the whole corpus, read once; with it
    the cached corpus is the sample (dpr/training/corpus_sample.py) and validation reads the corpus under its own
    limit (``val_corpus_max_passages``)."""
    from dpr.training.corpus_sample import auto_sample_size, sample_corpus

    have = paths.passages.is_file()
    if needs_corpus and not have:
        raise FileNotFoundError(f"{paths.passages}: corpus negatives / frozen-index steps need the passages file")
    size = tc.corpus_sample
    if needs_corpus and size is None:
        size = auto_sample_size(paths.passages)  # None while the whole corpus is small enough
    sampled = needs_corpus and size is not None
    corpus_texts = None
    if have and ((validates and tc.val_corpus_topk) or (needs_corpus and not sampled)):
        limit = 0 if needs_corpus and not sampled else tc.val_corpus_max_passages
        corpus_texts = load_corpus(paths.passages, limit)
    if not needs_corpus:
        return corpus_texts, None
    if not sampled:
        return corpus_texts, (*corpus_texts, None)
    named = (train_examples.pool_locations()[0] if hasattr(train_examples, "pool_locations") else
             {c["passage_id"] for ex in train_examples for key in ("positive_ctxs", "hard_negative_ctxs",
                                                                   "negative_ctxs") for c in ex[key]})
    sample = sample_corpus(paths.passages, size, seed, frozenset(named))
    return corpus_texts, (sample.ids, sample.texts, sample.titles, sample.positions)


def _finish(run: _Run, model, tokenizer, state: TrainState, precision: str, wall_start: float,
            extra: Mapping[str, Any] | None, *, resolved: Mapping[str, Any]) -> dict:
    """Save the best (or, without validation, the last) weights to the run's output directory and write the
    summary."""
    out, tc, conf, main, world = run.out, run.tc, run.conf, run.main, run.world
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
        "best_metric": {"name": state.best_metric or resolved["best_metric"], "value": state.best_value},
        "resolved": dict(resolved),
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
        write_model_card(out)  # README.md: what was trained how; the pipeline adds the evaluation later
        log.info("saved %s weights to %s", final_from, out)
    return summary
