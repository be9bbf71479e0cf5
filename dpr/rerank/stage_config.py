"""The settings of ``dpr-pipeline … teacher=true`` (`dpr.rerank.pipeline`): one dataclass, the one source of
defaults, registered in Hydra's ConfigStore as the ``teacher_cfg/schema`` option that ``conf/pipeline.yaml``
selects (``teacher: false`` is the switch, ``teacher_cfg.*`` the settings: the reader's pattern, since a
config group named ``teacher`` would make Hydra read ``teacher=true`` as a group choice). ``dpr-pipeline``
also takes ``teacher.<key>=`` for ``teacher_cfg.<key>=``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping

from dpr.config import Int, Real, check_fields, setting, strict_from_dict
from dpr.rerank.config import RerankConfig

# squad1_open dev, cross-encoder alone: MRR 90.3 / 90.3 / 89.9 (bm25), 89.5 / 89.7 / 89.5 (dense) at K = 20 / 50 /
# 100, so K = 20 for every system; scoring dev to 100 took 20 min of the run (docs/results/teacher.md). The
# grid [20, 50, 100] redoes that choice.
DEFAULT_K_GRID = (20,)
# minmax(logit) + w * minmax(first-stage score) over the top K (0: the cross-encoder alone), w tuned on dev
DEFAULT_WEIGHT_GRID = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0)
# one interpolation weight: the pipeline's grid and `dpr-rerank score weight=` follow the same rule
WEIGHT = Real(0)


@dataclass
class TeacherStageConfig:
    model: str = ""                    # a trained cross-encoder dir to use as it is ("": train one on the run's train.json)
    rerank: RerankConfig = field(default_factory=RerankConfig)  # the cross-encoder's training and scoring (dpr/rerank/config.py)
    # rerank depths tried on dev per first stage
    k_grid: List[int] = setting(rule=Int(1, count=(1, None)), factory=lambda: list(DEFAULT_K_GRID))
    # interpolation weights tried on dev
    weight_grid: List[float] = setting(rule=replace(WEIGHT, count=(1, None)), factory=lambda: list(DEFAULT_WEIGHT_GRID))
    # K = the smallest depth within this much of the best dev MRR / nDCG@10
    k_tolerance: float = setting(0.005, Real(0, 1))
    keep_first_stage: bool = True      # a first stage whose dev figure reranking lowers (at its K and w) keeps its
                                       # own list as its +rerank row (nfcorpus's hybrid: dev nDCG@10 0.345 -> 0.344)
    distill: bool = True               # the report's dense model is distilled from the teacher's scores (false: contrastive)
    loss: str = "kl_distill"           # loss/<name>.yaml of the config search path (conf/, a --config-dir) for the
                                       # distilled training (a loss with teacher = "scores")
    # KL + DPR's NLL with denoising: the best of the dev ablation (docs/results/teacher.md); KL or Margin-MSE
    # alone made the model worse than untrained on squad1_open dev
    loss_args: Dict[str, Any] = field(default_factory=lambda: {"nll_weight": 1.0})  # overrides of that loss's keys
    denoise: Any = "auto"              # drop mined negatives the teacher scores above (positive - denoise_margin):
                                       # auto = when distilling (distill=false keeps the default's contrastive model)
    denoise_margin: float = setting(0.0, Real(0))
    # candidates the teacher scores per question: positives + the first N mined negatives
    # (0: all; squad1_open: 3 -> 32k pairs, 3 min in bf16 on 2 cores; all 30 -> 26 min)
    max_negatives: int = setting(3, Int(0, note="0: all"))
    # train.hard_negatives of the distilled training, drawn among the scored ones
    # (train.teacher_scored_negatives; 0: keep the pipeline's train.hard_negatives)
    hard_negatives: int = setting(3, Int(0, note="0: keep the pipeline's train.hard_negatives"))
    # questions per resumable scoring chunk (does not change the scores)
    chunk_size: int = setting(512, Int(1))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "TeacherStageConfig":
        d = dict(d or {})
        rerank = RerankConfig.from_dict(dict(d.pop("rerank", None) or {}))
        cfg = strict_from_dict(cls, {**d, "rerank": rerank}, "teacher_cfg")
        cfg.check()
        return cfg

    def check(self) -> None:
        """One-line ValueError naming the first key out of its range."""
        check_fields(self, "teacher_cfg")  # the rules its fields declare (dpr/config.py)
        grid = list(self.k_grid)
        if len(set(grid)) != len(grid):
            raise ValueError(f"teacher_cfg.k_grid={grid!r}: a depth is listed twice")
        if self.denoise not in ("auto", True, False):
            raise ValueError(f"teacher_cfg.denoise={self.denoise!r}: must be auto, true or false")
        if not self.loss or "/" in self.loss:
            raise ValueError(f"teacher_cfg.loss={self.loss!r}: must name a conf/loss/<name>.yaml")

    @property
    def needs_scores(self) -> bool:
        """Distillation and denoising read the teacher's scores of the training candidates."""
        return self.distill or self.denoises

    @property
    def denoises(self) -> bool:
        """``denoise`` resolved: auto follows ``distill``."""
        return self.distill if self.denoise == "auto" else bool(self.denoise)


def register_schema() -> None:
    """``teacher_cfg/schema`` in Hydra's ConfigStore (conf/pipeline.yaml: ``optional teacher_cfg: schema``)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="teacher_cfg", name="schema", node=TeacherStageConfig)
