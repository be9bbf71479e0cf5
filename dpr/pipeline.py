"""The whole flow for one dataset: prepare → BM25 (+ mining) → train → encode → index → retrieve → hybrid → eval.

Every stage is a call into a plain module function; `StageRunner` skips stages whose outputs are
already there and up to date. The result is one report with BM25, the untrained model, the trained
model and the hybrid side by side (``teacher=true``: a cross-encoder teacher, the dense model distilled
from it, and each first stage reranked by it: `dpr.rerank.pipeline`).
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

from dpr import bm25, encode, index as faiss_index
from dpr.atomic import write_json_atomic
from dpr.bm25.config import index_settings
from dpr.config import strict_from_dict
from dpr.data.dataset import DatasetPaths
from dpr.data.prepare import prepare_dataset
from dpr.encode_config import DenseConfig, EncodeConfig
from dpr.eval.report import evaluate_qa, evaluate_qrels
from dpr.index.truncate import truncate_embeddings
from dpr.losses import build_loss
from dpr.model_card import write_model_card
from dpr.models import BiEncoderConfig, build_biencoder, save_biencoder
from dpr.models.run_format import model_marker, model_outputs
from dpr.negatives import bm25 as bm25_negatives
from dpr.negatives.config import RemineConfig
from dpr.negatives.dense import remine_dataset
from dpr.pipeline_encode import encode_on_every_rank, passage_count
from dpr.pipeline_scale import ScaleConfig, index_params
from dpr.retrieval import BM25Retriever, Retriever, runs as retrieve
from dpr.retrieval.fusion import fuse_linear, fuse_rrf, tune_linear_weight
from dpr.stages import StageRunner
from dpr.training.config import without_unset
from dpr.training.rounds import split_rounds
from dpr.training.teacher import bm25_teacher_section
from dpr.training.train import train
from dpr.trainkit.config_dict import plain

log = logging.getLogger(__name__)


def _model(cfg: DictConfig) -> dict:
    """The ``model`` config as stages record it (`dpr.models.biencoder.without_empty_prefixes`)."""
    from dpr.models.biencoder import without_empty_prefixes

    return without_empty_prefixes(plain(cfg.model))


def _encode_config(cfg: DictConfig, dim: int | None = None) -> EncodeConfig:
    """The ``encode`` section as `encode_corpus` takes it: its keys (and any other EncodeConfig field a user adds,
    ``+encode.max_length=128``) over EncodeConfig's defaults; a key that is no field is one line naming it.
    ``dim``: the Matryoshka size the dense systems are encoded at (``dense.dim``; not a key of the section, whose
    keys are every encode stage's recorded parameters)."""
    section = plain(cfg.encode)
    return strict_from_dict(EncodeConfig, {**section, "dim": dim} if dim else section, "encode")


def dense_config(cfg: DictConfig) -> DenseConfig:
    """The ``dense`` section (``dense.dim``, ``dense.dims``: Matryoshka sizes), checked against the model's vector size
    where its files tell it (a projection, or a local model's hidden size); defaults when absent."""
    from dpr.index.fingerprint import model_dim
    from dpr.models.hub import resolve_model_name

    model = cfg.get("model") or {}
    full = model.get("projection_dim") or model_dim(resolve_model_name(str(model.get("name", ""))))
    return strict_from_dict(DenseConfig, plain(cfg.get("dense") or {}), "dense").check(full)


def encode_params(cfg: DictConfig, dim: int | None) -> dict:
    """An encode stage's recorded parameters: the ``encode`` section, plus ``dim`` only where ``dense.dim`` sets it
    (so the stages of a run without it keep their fingerprints)."""
    return {**plain(cfg.encode), "dim": dim} if dim else plain(cfg.encode)


def _questions(ds: DatasetPaths, split: str) -> list[Path]:
    """The files that define a split's evaluation questions."""
    return [ds.queries, ds.qrels(split)] if ds.kind == "qrels" else [ds.qa(split)]


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
        model = _model(cfg)
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
                                                                                      _encode_config(cfg)),
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
        encode.save_encoded(model_dir, ds.passages, export_emb, ids, vectors.numpy(), _encode_config(cfg, dim),
                            computed_with=computed_with)

    return train(train_cfg, extra_summary=extra, start_vectors=start, on_saved=on_saved)


def run_pipeline(cfg: DictConfig) -> dict:
    """Run every stage for ``cfg.data`` and return the evaluation report (with ``until=train``: stop
    after training, for dev-only ablations, and return where the model and its dev figures are)."""
    start = time.perf_counter()
    until = cfg.get("until")
    if until not in (None, "train"):
        raise ValueError(f"until must be null (every stage) or train, got {until!r}")
    split_rounds(plain(cfg.train))  # train.rounds and the remine settings: checked before any stage runs
    dense = dense_config(cfg)  # dense.dim / dense.dims: checked before any stage runs
    from dpr.models.backbone import check_trainable_dtype
    check_trainable_dtype(cfg.model.get("dtype", "fp32"), cfg.model.get("lora"))  # before any stage runs
    scale = strict_from_dict(ScaleConfig, plain(cfg.get("scale") or {}), "scale").check()
    RemineConfig.from_dict(plain(cfg.get("remine")))
    if cfg.get("teacher"):  # the teacher's settings checked before any stage runs
        from dpr.rerank.pipeline import check_teacher
        check_teacher(cfg)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stages = StageRunner(out / "stages", force=bool(cfg.get("force", False)))

    # 1. data (has its own up-to-date check)
    t0 = time.perf_counter()
    ds = _dataset(cfg)
    stages.timings["prepare"] = time.perf_counter() - t0
    qrels_data = ds.kind == "qrels"
    split_eval, split_dev = "test", "dev"

    # 2. BM25: index, test and dev retrieval, hard-negative mining
    bcfg = cfg.bm25
    bm25_params = index_settings(plain(bcfg))  # the teacher of loss=lexical_distill builds this index with them too
    bm25_dir = out / "bm25"
    index_holder: dict[str, Any] = {}

    def bm25_index():
        if "index" not in index_holder:
            index_holder["index"] = bm25.get_or_build_index(ds.passages, ds.root / "bm25_index", **bm25_params)
        return index_holder["index"]

    ext = ".trec" if qrels_data else ".json"
    bm25_test, bm25_dev = bm25_dir / f"{split_eval}{ext}", bm25_dir / f"{split_dev}{ext}"

    def bm25_retrieve() -> None:
        retriever = BM25Retriever(bm25_index(), None if qrels_data else ds.passages)  # one for both splits
        for split, path in ((split_eval, bm25_test), (split_dev, bm25_dev)):
            retrieve.retrieve_split(retriever, ds, split, path, k=bcfg.k)

    stages.run(
        "bm25_retrieve",
        bm25_retrieve,
        outputs=[bm25_test, bm25_dev],
        inputs=[ds.passages, *_questions(ds, split_eval), *_questions(ds, split_dev)],
        params=plain(bcfg),
    )
    if bcfg.mine:
        stages.run(
            "bm25_mine",
            lambda: bm25_negatives.mine_dataset(bm25_index(), ds, num_negatives=bcfg.num_negatives, depth=bcfg.k),
            outputs=[ds.train, ds.dev],
            inputs=[ds.passages, ds.train, ds.dev],
            params=plain(bcfg),
        )

    # 3-4. dense retrieval with the untrained and the trained model
    model_dir = out / "model"
    systems: dict[str, dict[str, Path]] = {}

    def dense_system(name: str, model_path: str, model_inputs: list,
                     make_vectors: Callable[[Path], Any] | None = None) -> dict[str, Path]:
        """Encode (at ``dense.dim``), index, retrieve test and dev. ``make_vectors(emb)``: writes the system's
        embeddings instead, as its own stage (``dense@<d>``: `dpr.index.truncate`)."""
        sdir = out / name
        emb, idx = sdir / "embeddings", sdir / "index.faiss"
        res = {split: sdir / f"{split}{ext}" for split in (split_eval, split_dev)}
        if make_vectors is not None:
            make_vectors(emb)
        else:
            stages.run(
                f"{name}_encode",
                lambda: encode_on_every_rank(model_path, ds.passages, emb, _encode_config(cfg, dense.dim)),
                outputs=[emb], inputs=[ds.passages, *model_inputs], params=encode_params(cfg, dense.dim),
            )
        index_cfg = index_params(plain(cfg.index), scale, emb)  # the index section, or above a size a compact one
        stages.run(
            f"{name}_index",
            lambda: faiss_index.build_and_save(emb, idx, **index_cfg),
            outputs=[idx], inputs=[emb], params=index_cfg,
        )
        for split, path in res.items():
            stages.run(
                f"{name}_retrieve_{split}",
                lambda split=split, path=path: retrieve.retrieve_split(
                    Retriever.dense(model_path, idx, None if qrels_data else ds.passages,
                                    batch_size=cfg.retrieve.batch_size, autocast=cfg.retrieve.autocast,
                                    weights=cfg.retrieve.weights, index_device=scale.search_device()),
                    ds, split, path, k=cfg.retrieve.k),
                outputs=[path], inputs=[idx, *_questions(ds, split), *model_inputs],
                params=plain(cfg.retrieve),
            )
        return res

    # The untrained system is exactly the trainer's starting point (same towers, pooling, similarity),
    # saved as a run dir so encode/retrieve treat both systems alike.
    untrained_dir = out / "dense_untrained" / "model"

    def save_untrained():
        torch.manual_seed(cfg.seed)  # a projection layer, if configured, starts from this seed
        model, tokenizer = build_biencoder(BiEncoderConfig.from_dict(_model(cfg)))
        save_biencoder(model, tokenizer, untrained_dir)

    if scale.keeps_untrained(passage_count(ds.passages)):  # scale.untrained: a baseline for small corpora
        # one rank saves the model in place; the others would read it mid-write (one_rank: they wait)
        stages.run("untrained_model", save_untrained, outputs=[model_marker(untrained_dir)], one_rank=True,
                   params={"model": _model(cfg), "seed": cfg.seed})
        systems["dense_untrained"] = dense_system(
            "dense_untrained", str(untrained_dir), [model_marker(untrained_dir)])

    teacher = None
    if cfg.get("teacher"):  # the cross-encoder teacher, its scores, the distilled training
        from dpr.rerank.pipeline import run_teacher
        teacher = run_teacher(cfg, ds, out, stages, bm25_dev)
    train_model_rounds(teacher.train_cfg if teacher else cfg, ds, out, model_dir, stages,
                       teacher.train_inputs if teacher else [],
                       round_scores=teacher.round_scores(stages) if teacher else None)
    if until == "train":  # a dev-only run (ablations): the trained model never meets the test split
        return _finish(out, stages, start, {"until": "train", "model": str(model_dir),
                                            "train_summary": str(model_dir / "train_summary.json")})
    systems["dense"] = dense_system("dense", str(model_dir), [model_marker(model_dir)])
    # dense.dims: dense@<d>, the trained model's vectors truncated to d (no re-encode); the hybrid stays dense's
    full_emb = out / "dense" / "embeddings"
    for d in dense.dims:
        systems[f"dense@{d}"] = dense_system(f"dense@{d}", str(model_dir), [model_marker(model_dir)], lambda emb, d=d: (
            stages.run(f"dense@{d}_truncate", lambda: truncate_embeddings(full_emb, emb, d), outputs=[emb],
                       inputs=[full_emb], params={"dim": d})))

    # 5. hybrid: linear fusion weight tuned on dev, plus reciprocal rank fusion for reference
    hyb_dir = out / "hybrid"
    hybrid_test, rrf_test = hyb_dir / f"{split_eval}{ext}", hyb_dir / f"rrf_{split_eval}{ext}"
    tuning_file = hyb_dir / "weight.json"

    def hybrid():
        weight, table = tune_linear_weight(
            bm25_dev, systems["dense"][split_dev], grid=list(cfg.hybrid.grid), metric_k=cfg.hybrid.metric_k,
            metric=cfg.hybrid.metric,
            qrels=ds.qrels(split_dev) if qrels_data else None, normalize=cfg.hybrid.normalize)
        fuse_linear(bm25_test, systems["dense"][split_eval], weight, hybrid_test,
                    k=cfg.retrieve.k, normalize=cfg.hybrid.normalize)
        fuse_rrf(bm25_test, systems["dense"][split_eval], rrf_test, k=cfg.retrieve.k, k_rrf=cfg.hybrid.k_rrf)
        write_json_atomic(tuning_file, {"weight": weight, "metric": cfg.hybrid.metric, "metric_k": cfg.hybrid.metric_k,
                                        "normalize": cfg.hybrid.normalize, "grid": table})

    stages.run(
        "hybrid", hybrid, outputs=[hybrid_test, rrf_test, tuning_file],
        inputs=[bm25_test, bm25_dev, *systems["dense"].values()], params=plain(cfg.hybrid),
    )

    # 6. one report, four systems side by side
    runs = {
        "bm25": bm25_test,
        **({"dense_untrained": systems["dense_untrained"][split_eval]} if "dense_untrained" in systems else {}),
        "dense": systems["dense"][split_eval],
        **{name: res[split_eval] for name, res in systems.items() if name.startswith("dense@")},
        "hybrid": hybrid_test,
        "hybrid_rrf": rrf_test,
    }
    if teacher is not None:  # bm25/dense/hybrid+rerank: each first stage's top K reranked by the teacher
        from dpr.rerank.pipeline import rerank_stages
        first = {"bm25": {"dev": bm25_dev, "test": bm25_test}, "dense": systems["dense"], "hybrid": {"test": hybrid_test}}
        rerank_runs, rerank_notes = rerank_stages(cfg, ds, out, stages, teacher, first, tuning_file)
        runs.update(rerank_runs)
    notes = _report_notes(cfg, stages, json.loads(tuning_file.read_text()), split_dev, model_dir,
                          {"teacher": teacher.notes, "rerank": rerank_notes} if teacher is not None else {})
    eval_dir = out / "eval"
    if qrels_data:
        report = evaluate_qrels(runs, ds.qrels(split_eval), eval_dir, notes=notes)
    else:
        report = evaluate_qa(runs, eval_dir, ks=list(cfg.eval.ks), match=cfg.eval.match, notes=notes)
    if cfg.get("reader") and not qrels_data:  # the extractive reader on each system's top k
        from dpr.reader.pipeline import attach_reader, reader_report
        report = attach_reader(report, reader_report(cfg.reader_cfg, ds, runs, out, stages), out, eval_dir, stages)
    write_model_card(model_dir, report=eval_dir / "report.json")  # the trained model's card, with the report
    log.info("report: %s", eval_dir / "report.md")
    return _finish(out, stages, start, report)


def _report_notes(cfg: DictConfig, stages: StageRunner, tuning: dict, split_dev: str, model_dir: Path,
                  extra: dict) -> dict:
    """The report's notes: the dataset, the hybrid's tuned weight, the model, each stage's seconds, ``extra`` (the
    teacher's) and, where the trainer wrote its summary, the dev validation of the untrained and the trained
    model."""
    notes = {
        "dataset": cfg.data.name,
        "hybrid": f"linear fusion dense + w*bm25, w={tuning['weight']} tuned on {split_dev} "
                  f"({tuning['grid'][0]['metric']}, normalize={tuning['normalize']}); hybrid_rrf: reciprocal rank fusion k={cfg.hybrid.k_rrf}",
        "model": cfg.model.name,
        "stage_seconds": {k: round(v, 1) for k, v in stages.timings.items()},
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
