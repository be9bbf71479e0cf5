"""The settings of ``dpr-pipeline … teacher=true`` (`dpr.rerank.pipeline`): one dataclass, the one source of
defaults, registered in Hydra's ConfigStore as the ``teacher_cfg/schema`` option that ``conf/pipeline.yaml``
selects (``teacher: false`` is the switch, ``teacher_cfg.*`` the settings: the reader's pattern, since a
config group named ``teacher`` would make Hydra read ``teacher=true`` as a group choice). ``dpr-pipeline``
also takes ``teacher.<key>=`` for ``teacher_cfg.<key>=``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping

from dpr.config import strict_from_dict
from dpr.rerank.config import RerankConfig

# squad1_open dev, cross-encoder alone: MRR 90.3 / 90.3 / 89.9 (bm25), 89.5 / 89.7 / 89.5 (dense) at K = 20 / 50 /
# 100, so K = 20 for every system; scoring dev to 100 took 20 min of the run (docs/results/teacher.md). The
# grid [20, 50, 100] redoes that choice.
DEFAULT_K_GRID = (20,)
# minmax(logit) + w * minmax(first-stage score) over the top K (0: the cross-encoder alone), w tuned on dev
DEFAULT_WEIGHT_GRID = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0)


@dataclass
class TeacherStageConfig:
    model: str = ""                    # a trained cross-encoder dir to use as it is ("": train one on the run's train.json)
    rerank: RerankConfig = field(default_factory=RerankConfig)  # the cross-encoder's training and scoring (dpr/rerank/config.py)
    k_grid: List[int] = field(default_factory=lambda: list(DEFAULT_K_GRID))  # rerank depths tried on dev per first stage
    weight_grid: List[float] = field(default_factory=lambda: list(DEFAULT_WEIGHT_GRID))  # interpolation weights tried on dev
    k_tolerance: float = 0.005         # K = the smallest depth within this much of the best dev MRR / nDCG@10
    distill: bool = True               # the report's dense model is distilled from the teacher's scores (false: contrastive)
    loss: str = "kl_distill"           # conf/loss/<name>.yaml for the distilled training (a loss with teacher = "scores")
    # KL + DPR's NLL with denoising: the best of the dev ablation (docs/results/teacher.md); KL or Margin-MSE
    # alone made the model worse than untrained on squad1_open dev
    loss_args: Dict[str, Any] = field(default_factory=lambda: {"nll_weight": 1.0})  # overrides of that loss's keys
    denoise: Any = "auto"              # drop mined negatives the teacher scores above (positive - denoise_margin):
                                       # auto = when distilling (distill=false keeps the default's contrastive model)
    denoise_margin: float = 0.0
    max_negatives: int = 3             # candidates the teacher scores per question: positives + the first N mined negatives
                                       # (0: all; squad1_open: 3 -> 32k pairs, 3 min in bf16 on 2 cores; all 30 -> 26 min)
    hard_negatives: int = 3            # train.hard_negatives of the distilled training, drawn among the scored ones
                                       # (train.teacher_scored_negatives; 0: keep the pipeline's train.hard_negatives)
    chunk_size: int = 512              # questions per resumable scoring chunk (does not change the scores)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "TeacherStageConfig":
        d = dict(d or {})
        rerank = RerankConfig.from_dict(dict(d.pop("rerank", None) or {}))
        cfg = strict_from_dict(cls, {**d, "rerank": rerank}, "teacher_cfg")
        cfg.check()
        return cfg

    def check(self) -> None:
        """One-line ValueError naming the first key out of its range."""
        grid = list(self.k_grid)
        if not grid or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in grid):
            raise ValueError(f"teacher_cfg.k_grid={grid!r}: must be a non-empty list of integers >= 1")
        if len(set(grid)) != len(grid):
            raise ValueError(f"teacher_cfg.k_grid={grid!r}: a depth is listed twice")
        weights = list(self.weight_grid)
        if not weights or any(isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0 for w in weights):
            raise ValueError(f"teacher_cfg.weight_grid={weights!r}: must be a non-empty list of numbers >= 0")
        if isinstance(self.k_tolerance, bool) or not (isinstance(self.k_tolerance, (int, float))
                                                          and 0 <= self.k_tolerance <= 1):
            raise ValueError(f"teacher_cfg.k_tolerance={self.k_tolerance!r}: must be a number in [0, 1]")
        if self.denoise not in ("auto", True, False):
            raise ValueError(f"teacher_cfg.denoise={self.denoise!r}: must be auto, true or false")
        if not (isinstance(self.denoise_margin, (int, float)) and self.denoise_margin >= 0):
            raise ValueError(f"teacher_cfg.denoise_margin={self.denoise_margin!r}: must be a number >= 0")
        for key in ("max_negatives", "hard_negatives", "chunk_size"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if key == "chunk_size" else 0):
                raise ValueError(f"teacher_cfg.{key}={v!r}: must be an integer >= {1 if key == 'chunk_size' else 0}")
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
