"""The whole flow for one dataset: prepare → BM25 (+ mining) → train → encode → index → retrieve → hybrid → eval.

Every stage is a call into a plain module function; `StageRunner` skips stages whose outputs are
already there and up to date. The result is one report with BM25, the untrained model, the trained
model and the hybrid side by side (``teacher=true``: a cross-encoder teacher, the dense model distilled
from it, and each first stage reranked by it: `dpr.rerank.pipeline`).

`run_pipeline` is the composition: the settings checked (`dpr.pipeline_settings`), the dataset, BM25, the untrained
model's system, training (`train_model_rounds`), the trained model's systems and the hybrid
(`dpr.pipeline_systems`), then the report.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from dpr import encode, index as faiss_index
from dpr.atomic import write_json_atomic
from dpr.data.dataset import DatasetPaths
from dpr.data.prepare import prepare_dataset
from dpr.eval.report import evaluate_qa, evaluate_qrels
from dpr.losses import build_loss
from dpr.model_card import write_model_card
from dpr.models.run_format import model_marker, model_outputs
from dpr.negatives.config import RemineConfig
from dpr.negatives.dense import remine_dataset
from dpr.pipeline_encode import encode_on_every_rank, passage_count
from dpr.pipeline_settings import check_settings, dense_config, encode_config, model_section
from dpr.pipeline_systems import (SPLIT_DEV, SPLIT_EVAL, HybridFiles, PipelineRun, bm25_system, hybrid_system,
                                  trained_systems, untrained_system)
from dpr.stages import StageRunner
from dpr.training.config import without_unset
from dpr.training.rounds import split_rounds
from dpr.training.teacher import bm25_teacher_section
from dpr.training.train import train
from dpr.trainkit.config_dict import plain

log = logging.getLogger(__name__)
_model = model_section  # the stages' model parameters (tests/models/data/record_presets.py reads them by this name)


def _dataset(cfg: DictConfig) -> DatasetPaths:
    """Prepare a registered dataset (up-to-date check inside), or use one prepared elsewhere (``recipe: none``)."""
    if cfg.data.get("recipe") == "none":
        ds = DatasetPaths.of(cfg.data_dir, cfg.data.name)
        if not ds.passages.is_file():
            raise FileNotFoundError(f"{ds.passages}: data.recipe=none expects a prepared dataset there")
        return ds
    return DatasetPaths(prepare_dataset(cfg.data, cfg.data_dir, mirror_dir=cfg.data.get("mirror_dir"),
                                        force=bool(cfg.get("force", False))))


def train_model_rounds(cfg: DictConfig, ds: DatasetPaths, out: Path, model_dir: Path, stages: StageRunner,
                       extra_inputs: Sequence[Path] = (),
                       round_scores: Callable[[int, Path, Path], Path] | None = None) -> None:
    """Train ``train.rounds`` times: round 1 on the dataset's (BM25-mined) training file; each later round
    continues from the previous round's model, on negatives re-mined from that model's own index
    (:mod:`dpr.negatives.dense`, ANCE-style, with the ``remine`` settings). The last round's model is
    ``model_dir``; earlier ones live in ``<output_dir>/rounds/round<r>/``. ``extra_inputs``: more files the
    training reads (teacher scores). ``round_scores(r, train_file, round_dir)``: with a teacher, scores a
    re-mined round's candidates (its own cached stage) and returns the scores file that round distils from."""
    # train.rounds is the pipeline's key, not the trainer's: stripped from what train() and the stages see
    rounds, train_section = split_rounds(plain(cfg.train))
    remine = RemineConfig.from_dict(plain(cfg.get("remine")))
    # a loss with a BM25 teacher (lexical_distill) builds the dataset's index with the run's bm25.* (recorded in the
    # train stage only when they are not the defaults: stages of the default settings stay up to date)
    teacher_bm25 = bm25_teacher_section(build_loss(plain(cfg.get("loss"))), plain(cfg.get("bm25")))
    dense_dim = dense_config(cfg).dim  # dense.dim: the dense systems' vectors are truncated to it
    prev_model: Path | None = None
    for r in range(1, rounds + 1):
        rdir = out / "rounds" / f"round{r}"
        mdir = model_dir if r == rounds else rdir / "model"
        train_file = ds.train
        model = model_section(cfg)
        if prev_model is not None:
            train_file = rdir / "train.json"
            prev_index = out / "rounds" / f"round{r - 1}" / "index.faiss"
            # The teacher scores each question's first teacher.max_negatives, so with a teacher the two sources
            # alternate and that prefix holds re-mined negatives (with BM25's part first, the round re-scored
            # round 1's candidates). Without one the trainer shuffles the whole list: the order stays as recorded.
            interleave = {"interleave": True} if round_scores is not None else {}
            stages.run(
                f"remine_round{r}",
                lambda pm=prev_model, pi=prev_index, tf=train_file, il=interleave: remine_dataset(
                    pm, pi, ds, tf, **remine.as_kwargs(), **il),
                # the model that mines is an input (its index and biencoder.json): the settings are the parameters
                outputs=[train_file], inputs=[prev_index, ds.train, model_marker(prev_model)],
                params={"remine": dataclasses.asdict(remine), **interleave},
            )
            model = {**model, "name": str(prev_model)}  # continue from the previous round's weights
        # keys recorded only when set (train.attention_dropout) left out while null: earlier stages stay up to date
        train_keys, inputs = without_unset(train_section), list(extra_inputs)
        if prev_model is not None and round_scores is not None:  # the teacher scores the new candidates too
            scores = round_scores(r, train_file, rdir)
            train_keys, inputs = {**train_keys, "teacher_scores": str(scores)}, [scores]
        train_cfg = OmegaConf.create({
            "model": model, "data": plain(cfg.data), "train": train_keys, "loss": plain(cfg.get("loss")),
            "logger": plain(cfg.logger), "data_dir": str(cfg.data_dir), "output_dir": str(mdir),
            "seed": cfg.seed, "train_file": str(train_file), **teacher_bm25,
        })
        # The corpus as the starting weights encoded it (the untrained system's, or the last round's), and
        # where this round's weights will be exported: training reuses the one and fills the other.
        start_emb = out / ("dense_untrained" if r == 1 else f"rounds/round{r - 1}") / "embeddings"
        export_emb = rdir / "embeddings" if r < rounds else out / "dense" / "embeddings"
        if r == rounds and cfg.get("until") == "train":
            export_emb = None  # a dev-only run exports nothing
        stages.run(
            "train" if rounds == 1 else f"train_round{r}",
            lambda tc=train_cfg, se=start_emb, ee=export_emb, last=r == rounds: _train_reusing_vectors(
                cfg, ds, tc, se, ee, rounds, dense_dim if last else None, reuse_start=r > 1 or not dense_dim),
            outputs=model_outputs(mdir),
            inputs=[train_file, ds.dev, ds.passages, start_emb, *inputs], params=plain(train_cfg),
        )
        if r < rounds:  # the round's own index, to mine the next round's negatives from
            emb, idx = rdir / "embeddings", rdir / "index.faiss"
            stages.run(f"encode_round{r}", lambda m=mdir, e=emb: encode_on_every_rank(str(m), ds.passages, e,
                                                                                      encode_config(cfg)),
                       outputs=[emb], inputs=[ds.passages, model_marker(mdir)], params=plain(cfg.encode))
            stages.run(f"index_round{r}", lambda e=emb, i=idx: faiss_index.build_and_save(e, i, factory="Flat"),
                       outputs=[idx], inputs=[emb], params={"factory": "Flat"})
        prev_model = mdir


def _train_reusing_vectors(cfg: DictConfig, ds: DatasetPaths, train_cfg: DictConfig, start_emb: Path,
                           export_emb: Path | None, rounds: int, dim: int | None = None,
                           reuse_start: bool = True) -> dict:
    """``train`` started from the corpus vectors in ``start_emb`` (encoded by the starting weights), its
    saved weights' corpus vectors stored in ``export_emb`` (None: nowhere) as the export stage would write
    them (which then skips): two corpus encodings fewer per round (dpr.training.corpus_reuse). ``rounds``
    goes into the run's summary, for its model card (the train config no longer holds it). ``dim``: the export's
    ``dense.dim``; ``reuse_start`` false: ``start_emb`` holds truncated vectors the trainer cannot start from."""
    start = start_emb if reuse_start and start_emb.is_dir() else None  # read by the trainer, only when it uses it
    extra = {"rounds": rounds}
    if export_emb is None:
        return train(train_cfg, extra_summary=extra, start_vectors=start)

    def on_saved(model_dir: Path, ids: list[str], vectors: torch.Tensor, computed_with: dict) -> None:
        encode.save_encoded(model_dir, ds.passages, export_emb, ids, vectors.numpy(), encode_config(cfg, dim),
                            computed_with=computed_with)

    return train(train_cfg, extra_summary=extra, start_vectors=start, on_saved=on_saved)


def run_pipeline(cfg: DictConfig) -> dict:
    """Run every stage for ``cfg.data`` and return the evaluation report (with ``until=train``: stop
    after training, for dev-only ablations, and return where the model and its dev figures are)."""
    start = time.perf_counter()
    settings = check_settings(cfg)  # every section, before any stage runs
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stages = StageRunner(out / "stages", force=bool(cfg.get("force", False)))
    t0 = time.perf_counter()
    ds = _dataset(cfg)  # has its own up-to-date check
    stages.timings["prepare"] = time.perf_counter() - t0
    run = PipelineRun(cfg, settings, ds, out, stages)
    bm25_res = bm25_system(run)
    systems: dict[str, dict[str, Path]] = {}
    if settings.scale.keeps_untrained(passage_count(ds.passages)):  # scale.untrained: a small corpus's baseline
        systems["dense_untrained"] = untrained_system(run)
    model_dir = out / "model"
    teacher = _train(run, model_dir, bm25_res)
    if settings.until == "train":  # a dev-only run (ablations): the trained model never meets the test split
        return _finish(out, stages, start, {"until": "train", "model": str(model_dir),
                                            "train_summary": str(model_dir / "train_summary.json")})
    systems.update(trained_systems(run, model_dir))
    hybrid = hybrid_system(run, bm25_res, systems["dense"])
    return _finish(out, stages, start, _evaluate(run, model_dir, bm25_res, systems, hybrid, teacher))


def _train(run: PipelineRun, model_dir: Path, bm25_res: dict[str, Path]) -> Any:
    """The trained model in ``model_dir`` (`train_model_rounds`); with ``teacher=true`` first the cross-encoder
    teacher and its scores, the training distilled from them. Returns the teacher's stages (None: no teacher)."""
    teacher = None
    if run.cfg.get("teacher"):
        from dpr.rerank.pipeline import run_teacher
        teacher = run_teacher(run.cfg, run.ds, run.out, run.stages, bm25_res[SPLIT_DEV])
    train_model_rounds(teacher.train_cfg if teacher else run.cfg, run.ds, run.out, model_dir, run.stages,
                       teacher.train_inputs if teacher else [],
                       round_scores=teacher.round_scores(run.stages) if teacher else None)
    return teacher


def _evaluate(run: PipelineRun, model_dir: Path, bm25_res: dict[str, Path], systems: dict[str, dict[str, Path]],
              hybrid: HybridFiles, teacher: Any) -> dict:
    """One report, every system side by side (with a teacher, each first stage reranked too; with ``reader=true``
    the reader's figures on each system's top k); the trained model's card gets it."""
    cfg, ds, out = run.cfg, run.ds, run.out
    runs = {
        "bm25": bm25_res[SPLIT_EVAL],
        **({"dense_untrained": systems["dense_untrained"][SPLIT_EVAL]} if "dense_untrained" in systems else {}),
        "dense": systems["dense"][SPLIT_EVAL],
        **{name: res[SPLIT_EVAL] for name, res in systems.items() if name.startswith("dense@")},
        "hybrid": hybrid.test,
        "hybrid_rrf": hybrid.rrf_test,
    }
    extra: dict = {}
    if teacher is not None:  # bm25/dense/hybrid+rerank: each first stage's top K reranked by the teacher
        from dpr.rerank.pipeline import rerank_stages
        first = {"bm25": bm25_res, "dense": systems["dense"], "hybrid": {SPLIT_EVAL: hybrid.test}}
        rerank_runs, rerank_notes = rerank_stages(cfg, ds, out, run.stages, teacher, first, hybrid.tuning)
        runs.update(rerank_runs)
        extra = {"teacher": teacher.notes, "rerank": rerank_notes}
    notes = _report_notes(run, json.loads(hybrid.tuning.read_text()), model_dir, extra)
    eval_dir = out / "eval"
    if run.qrels:
        report = evaluate_qrels(runs, ds.qrels(SPLIT_EVAL), eval_dir, notes=notes)
    else:
        ec = run.settings.eval
        report = evaluate_qa(runs, eval_dir, ks=list(ec.ks), match=ec.match, notes=notes)
    if cfg.get("reader") and not run.qrels:  # the extractive reader on each system's top k
        from dpr.reader.pipeline import attach_reader, reader_report
        report = attach_reader(report, reader_report(cfg.reader_cfg, ds, runs, out, run.stages), out, eval_dir,
                               run.stages)
    write_model_card(model_dir, report=eval_dir / "report.json")  # the trained model's card, with the report
    log.info("report: %s", eval_dir / "report.md")
    return report


def _report_notes(run: PipelineRun, tuning: dict, model_dir: Path, extra: dict) -> dict:
    """The report's notes: the dataset, the hybrid's tuned weight, the model, each stage's seconds, ``extra`` (the
    teacher's) and, where the trainer wrote its summary, the dev validation of the untrained and the trained
    model."""
    notes = {
        "dataset": run.cfg.data.name,
        "hybrid": f"linear fusion dense + w*bm25, w={tuning['weight']} tuned on {SPLIT_DEV} "
                  f"({tuning['grid'][0]['metric']}, normalize={tuning['normalize']}); "
                  f"hybrid_rrf: reciprocal rank fusion k={run.settings.hybrid.k_rrf}",
        "model": run.cfg.model.name,
        "stage_seconds": {k: round(v, 1) for k, v in run.stages.timings.items()},
        **extra,
    }
    summary_file = model_dir / "train_summary.json"
    if summary_file.is_file():
        summary = json.loads(summary_file.read_text())
        notes["dev_validation"] = {"untrained": summary.get("initial_validation"),
                                   "trained": {k[4:]: v for k, v in summary.get("final_metrics", {}).items()
                                               if k.startswith("val_")},
                                   "kept": summary.get("final_weights")}
    return notes


def _finish(out: Path, stages: StageRunner, start: float, result: dict) -> dict:
    """Write ``timings.json`` (each stage's seconds and the total) and return ``result``."""
    total = time.perf_counter() - start
    timings = {**{k: round(v, 1) for k, v in stages.timings.items()}, "total": round(total, 1)}
    write_json_atomic(out / "timings.json", {"seconds": timings, "skipped": stages.skipped})
    log.info("pipeline finished in %.1f s; stage seconds: %s", total, timings)
    return result
