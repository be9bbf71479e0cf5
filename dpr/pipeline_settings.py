"""`dpr-pipeline`'s settings: each section of its config read as the dataclass it is, checked before any stage runs.

`check_settings` reads the sections the pipeline's own steps use (``retrieve``: `RetrieveConfig`, ``hybrid``:
`HybridConfig`, ``eval``: `EvalConfig`, ``bm25``: `BM25MiningConfig` and ``mine``, ``dense``: `DenseConfig`,
``scale``: `ScaleConfig`, ``remine``: `RemineConfig`), so a bad value is one line before any work. What a stage
*records* stays the section as the user's config holds it (`sections`): the dataclass's other fields at their
defaults are not added, so every recorded run's stages keep their fingerprints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from dpr.config import fields_from, strict_from_dict
from dpr.data.dataset import DatasetPaths
from dpr.encode_config import DenseConfig, EncodeConfig
from dpr.eval.config import EvalConfig
from dpr.negatives.bm25_config import BM25MiningConfig
from dpr.negatives.config import RemineConfig
from dpr.pipeline_scale import ScaleConfig
from dpr.retrieval.config import RetrieveConfig
from dpr.retrieval.fusion import HybridConfig
from dpr.trainkit.config_dict import plain

UNTIL = (None, "train")


def model_section(cfg: DictConfig) -> dict:
    """The ``model`` config as stages record it (`dpr.models.biencoder.without_empty_prefixes`)."""
    from dpr.models.biencoder import without_empty_prefixes

    return without_empty_prefixes(plain(cfg.model))


def encode_config(cfg: DictConfig, dim: int | None = None) -> EncodeConfig:
    """The ``encode`` section as `encode_corpus` takes it: its keys (and any other EncodeConfig field a user adds,
    ``+encode.max_length=128``) over EncodeConfig's defaults; a key that is no field is one line naming it.
    ``dim``: the Matryoshka size the dense systems are encoded at (``dense.dim``; not a key of the section, whose
    keys are every encode stage's recorded parameters)."""
    section = plain(cfg.encode)
    return strict_from_dict(EncodeConfig, {**section, "dim": dim} if dim else section, "encode")


def encode_params(cfg: DictConfig, dim: int | None) -> dict:
    """An encode stage's recorded parameters: the ``encode`` section, plus ``dim`` only where ``dense.dim`` sets it
    (so the stages of a run without it keep their fingerprints)."""
    return {**plain(cfg.encode), "dim": dim} if dim else plain(cfg.encode)


def model_size(cfg: DictConfig) -> int | None:
    """The size of the vectors ``cfg.model`` makes, where its settings or files tell it without loading weights
    (a projection, or a local model's hidden size); None where they do not."""
    from dpr.index.fingerprint import model_dim
    from dpr.models.hub import resolve_model_name

    model = cfg.get("model") or {}
    if model.get("projection_dim"):
        return int(model["projection_dim"])
    name = resolve_model_name(str(model.get("name", "")))
    size = model_dim(name)
    if size is None and name and not Path(name).exists():  # a hub name: its config where the cache holds it
        try:
            from transformers import AutoConfig

            size = getattr(AutoConfig.from_pretrained(name, local_files_only=True), "hidden_size", None)
        except (OSError, ValueError, KeyError):  # not cached, or no config it knows: checked where the model loads
            return None
    return size if isinstance(size, int) else None


def dense_config(cfg: DictConfig) -> DenseConfig:
    """The ``dense`` section (``dense.dim``, ``dense.dims``: Matryoshka sizes), checked against the model's vector size
    where its settings or files tell it (`model_size`); defaults when absent. A ``dense.dims`` size equal to the
    model's is refused too: ``dense@<d>`` truncates the dense system's vectors, and at the full size nothing is cut."""
    full = model_size(cfg)
    dense = strict_from_dict(DenseConfig, plain(cfg.get("dense") or {}), "dense").check(full)
    if full is not None and full in dense.dims:
        raise ValueError(f"dense.dims: {full} is the full size of the model's vectors (nothing to truncate: the "
                         "dense system is that size); give sizes below it")
    return dense


def questions(ds: DatasetPaths, split: str) -> list[Path]:
    """The files that define a split's evaluation questions."""
    return [ds.queries, ds.qrels(split)] if ds.has_qrels else [ds.qa(split)]


@dataclass(frozen=True)
class PipelineSettings:
    """The sections the pipeline's steps read, as their dataclasses (module doc)."""

    retrieve: RetrieveConfig
    hybrid: HybridConfig
    eval: EvalConfig
    bm25: BM25MiningConfig  # how deep BM25 retrieves (k) and the negatives it mines (num_negatives; depth: k)
    mine: bool  # bm25.mine: BM25 hard negatives mined into the dataset's training files
    dense: DenseConfig
    scale: ScaleConfig
    remine: RemineConfig
    until: Optional[str]  # null: every stage; train: stop after training


def check_settings(cfg: DictConfig) -> PipelineSettings:
    """Every setting the pipeline reads, checked before any stage runs (one line naming the first bad key)."""
    from dpr.models.backbone import check_trainable_dtype
    from dpr.training.rounds import split_rounds

    until = cfg.get("until")
    if until not in UNTIL:
        raise ValueError(f"until must be null (every stage) or train, got {until!r}")
    split_rounds(plain(cfg.train))  # train.rounds
    dense = dense_config(cfg)
    check_trainable_dtype(cfg.model.get("dtype", "fp32"), cfg.model.get("lora"))
    scale = strict_from_dict(ScaleConfig, plain(cfg.get("scale") or {}), "scale").check()
    remine = RemineConfig.from_dict(plain(cfg.get("remine")))
    bm25 = plain(cfg.bm25)
    settings = PipelineSettings(
        retrieve=strict_from_dict(RetrieveConfig, plain(cfg.retrieve), "retrieve"),
        hybrid=strict_from_dict(HybridConfig, plain(cfg.hybrid), "hybrid"),
        eval=strict_from_dict(EvalConfig, plain(cfg.eval), "eval"),
        bm25=fields_from(BM25MiningConfig, bm25), mine=bool(bm25.get("mine", True)),
        dense=dense, scale=scale, remine=remine, until=until)
    if cfg.get("teacher"):  # the teacher's settings
        from dpr.rerank.pipeline import check_teacher
        check_teacher(cfg)
    return settings
