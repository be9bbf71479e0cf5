"""The retrieval systems `dpr-pipeline` compares, each as its stages: BM25 (index, test and dev retrieval, hard-negative
mining), a dense system (encode, index, test and dev retrieval), the untrained model's, the trained model's and its
Matryoshka truncations (``dense@<d>``), and the hybrid of BM25 and the trained model.

Each function runs its stages through the run's `dpr.stages.StageRunner` with the parameters those stages have always
recorded (the config sections as written: `dpr.pipeline_settings`), so recorded runs stay up to date.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from omegaconf import DictConfig

from dpr import bm25, index as faiss_index
from dpr.atomic import write_json_atomic
from dpr.bm25.config import index_settings
from dpr.data.dataset import DatasetPaths
from dpr.index.truncate import truncate_embeddings
from dpr.models import BiEncoderConfig, build_biencoder, save_biencoder
from dpr.models.run_format import model_marker
from dpr.negatives import bm25 as bm25_negatives
from dpr.pipeline_encode import encode_on_every_rank
from dpr.pipeline_scale import index_params
from dpr.pipeline_settings import PipelineSettings, encode_config, encode_params, model_section, questions
from dpr.retrieval import BM25Retriever, Retriever, runs as retrieve
from dpr.retrieval.fusion import fuse_linear, fuse_rrf, tune_linear_weight
from dpr.stages import StageRunner
from dpr.trainkit.config_dict import plain

SPLIT_EVAL, SPLIT_DEV = "test", "dev"


@dataclass
class PipelineRun:
    """One pipeline run: its config, settings, dataset, run directory and stages."""

    cfg: DictConfig
    settings: PipelineSettings
    ds: DatasetPaths
    out: Path
    stages: StageRunner

    @property
    def qrels(self) -> bool:
        """A qrels dataset (TREC runs, judged by qrels) rather than QA (DPR results, judged by answers)."""
        return self.ds.has_qrels

    @property
    def ext(self) -> str:
        """The suffix of the run's result files."""
        return ".trec" if self.qrels else ".json"


def bm25_system(run: PipelineRun) -> dict[str, Path]:
    """BM25's test and dev retrieval, then (``bm25.mine``) hard negatives mined into the dataset's training files.
    Returns the result file of each split."""
    ds, section, mining = run.ds, plain(run.cfg.bm25), run.settings.bm25
    index_kw = index_settings(section)  # the lexical_distill teacher builds this index with them too
    res = {split: run.out / "bm25" / f"{split}{run.ext}" for split in (SPLIT_EVAL, SPLIT_DEV)}
    held: list = []

    def bm25_index() -> Any:
        """Built or loaded once, by the first stage that needs it."""
        if not held:
            held.append(bm25.get_or_build_index(ds.passages, ds.root / "bm25_index", **index_kw))
        return held[0]

    def retrieve_both() -> None:
        retriever = BM25Retriever(bm25_index(), None if run.qrels else ds.passages)  # one for both splits
        for split, path in res.items():
            retrieve.retrieve_split(retriever, ds, split, path, k=mining.k)

    run.stages.run("bm25_retrieve", retrieve_both, outputs=list(res.values()),
                   inputs=[ds.passages, *questions(ds, SPLIT_EVAL), *questions(ds, SPLIT_DEV)], params=section)
    if run.settings.mine:
        run.stages.run(
            "bm25_mine",
            lambda: bm25_negatives.mine_dataset(bm25_index(), ds, num_negatives=mining.num_negatives,
                                                depth=mining.k),
            outputs=[ds.train, ds.dev], inputs=[ds.passages, ds.train, ds.dev], params=section)
    return res


def dense_system(run: PipelineRun, name: str, model_path: str | Path, model_inputs: list,
                 make_vectors: Callable[[Path], Any] | None = None) -> dict[str, Path]:
    """Encode (at ``dense.dim``), index, retrieve test and dev; returns the result file of each split.
    ``make_vectors(emb)``: writes the system's embeddings instead, as its own stage (``dense@<d>``)."""
    cfg, ds, stages, dim = run.cfg, run.ds, run.stages, run.settings.dense.dim
    sdir, model_path = run.out / name, str(model_path)
    emb, idx = sdir / "embeddings", sdir / "index.faiss"
    if make_vectors is not None:
        make_vectors(emb)
    else:
        stages.run(f"{name}_encode",
                   lambda: encode_on_every_rank(model_path, ds.passages, emb, encode_config(cfg, dim)),
                   outputs=[emb], inputs=[ds.passages, *model_inputs], params=encode_params(cfg, dim))
    index_cfg = index_params(plain(cfg.index), run.settings.scale, emb)  # above a size, a compact index
    stages.run(f"{name}_index", lambda: faiss_index.build_and_save(emb, idx, **index_cfg),
               outputs=[idx], inputs=[emb], params=index_cfg)
    res = {split: sdir / f"{split}{run.ext}" for split in (SPLIT_EVAL, SPLIT_DEV)}
    rc = run.settings.retrieve
    for split, path in res.items():
        stages.run(
            f"{name}_retrieve_{split}",
            lambda split=split, path=path: retrieve.retrieve_split(
                Retriever.dense(model_path, idx, None if run.qrels else ds.passages, batch_size=rc.batch_size,
                                autocast=rc.autocast, weights=rc.weights,
                                index_device=run.settings.scale.search_device()),
                ds, split, path, k=rc.k),
            outputs=[path], inputs=[idx, *questions(ds, split), *model_inputs], params=plain(cfg.retrieve))
    return res


def untrained_system(run: PipelineRun) -> dict[str, Path]:
    """The trainer's exact starting point (same towers, pooling, similarity) saved as a run directory, then searched
    as a dense system like the trained one."""
    cfg, model_dir = run.cfg, run.out / "dense_untrained" / "model"

    def save_untrained() -> None:
        torch.manual_seed(cfg.seed)  # a projection layer, if configured, starts from this seed
        model, tokenizer = build_biencoder(BiEncoderConfig.from_dict(model_section(cfg)))
        save_biencoder(model, tokenizer, model_dir)

    # one rank saves the model in place; the others would read it mid-write (one_rank: they wait)
    run.stages.run("untrained_model", save_untrained, outputs=[model_marker(model_dir)], one_rank=True,
                   params={"model": model_section(cfg), "seed": cfg.seed})
    return dense_system(run, "dense_untrained", model_dir, [model_marker(model_dir)])


def trained_systems(run: PipelineRun, model_dir: Path) -> dict[str, dict[str, Path]]:
    """``dense`` (the trained model) and, per ``dense.dims`` size d, ``dense@<d>``: its vectors truncated to d (no
    re-encode: `dpr.index.truncate`), each with its own index and retrieval."""
    inputs = [model_marker(model_dir)]
    systems = {"dense": dense_system(run, "dense", model_dir, inputs)}
    full_emb = run.out / "dense" / "embeddings"
    for d in run.settings.dense.dims:
        def cut(emb: Path, d: int = d) -> None:
            run.stages.run(f"dense@{d}_truncate", lambda: truncate_embeddings(full_emb, emb, d), outputs=[emb],
                           inputs=[full_emb], params={"dim": d})

        systems[f"dense@{d}"] = dense_system(run, f"dense@{d}", model_dir, inputs, cut)
    return systems


@dataclass(frozen=True)
class HybridFiles:
    test: Path  # linear fusion, its weight tuned on dev
    rrf_test: Path  # reciprocal rank fusion, for reference
    tuning: Path  # the tuned weight and the dev grid it was chosen on


def hybrid_system(run: PipelineRun, bm25_res: dict[str, Path], dense_res: dict[str, Path]) -> HybridFiles:
    """BM25 fused with the trained model: the linear fusion weight tuned on dev, plus reciprocal rank fusion."""
    hyb_dir, hc, k = run.out / "hybrid", run.settings.hybrid, run.settings.retrieve.k
    files = HybridFiles(hyb_dir / f"{SPLIT_EVAL}{run.ext}", hyb_dir / f"rrf_{SPLIT_EVAL}{run.ext}",
                        hyb_dir / "weight.json")

    def hybrid() -> None:
        weight, table = tune_linear_weight(
            bm25_res[SPLIT_DEV], dense_res[SPLIT_DEV], grid=list(hc.grid), metric_k=hc.metric_k, metric=hc.metric,
            qrels=run.ds.qrels(SPLIT_DEV) if run.qrels else None, normalize=hc.normalize)
        fuse_linear(bm25_res[SPLIT_EVAL], dense_res[SPLIT_EVAL], weight, files.test, k=k, normalize=hc.normalize)
        fuse_rrf(bm25_res[SPLIT_EVAL], dense_res[SPLIT_EVAL], files.rrf_test, k=k, k_rrf=hc.k_rrf)
        write_json_atomic(files.tuning, {"weight": weight, "metric": hc.metric, "metric_k": hc.metric_k,
                                         "normalize": hc.normalize, "grid": table})

    run.stages.run("hybrid", hybrid, outputs=[files.test, files.rrf_test, files.tuning],
                   inputs=[bm25_res[SPLIT_EVAL], bm25_res[SPLIT_DEV], *dense_res.values()],
                   params=plain(run.cfg.hybrid))
    return files
