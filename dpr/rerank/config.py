"""The cross-encoder's settings: one dataclass tree is the schema of ``dpr-rerank`` (registered in Hydra's
ConfigStore as ``rerank_schema``; ``conf/rerank.yaml`` only selects it) and the one source of defaults,
also for Python callers of `dpr.rerank.train.train_cross_encoder`.

Defaults are sized for squad1_open with all-MiniLM-L6-v2 on a 2-core CPU (bf16 autocast where it has it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from dpr.checks import SEED, SEED_MAX
from dpr.config import Int, Real, check_fields, setting, strict_from_dict
from dpr.models.hub import DEFAULT_MODEL_ALIAS
from dpr.models.lora import LoraSettings

LOSS_NAMES = ("listwise", "bce")
NEGATIVE_SOURCES = ("mined", "random", "mixed")
PRECISIONS = ("auto", "fp32", "bf16")
METRICS_QA = ("mrr", "top1", "top5", "top20")
METRICS_QRELS = ("ndcg@10", "mrr@10", "recall@10")


@dataclass
class RerankTrainConfig:
    # the defaults: squad1_open's recipe (docs/results/teacher.md): one epoch (998 steps x 8 x (1 + 3), 78 min on
    # 2 Zen 4 cores in bf16). On all 649 dev questions it reranks BM25's top 20 to top-1 89.5 (300 steps: 88.0),
    # the distilled dense's to 88.1 (85.8) and the hybrid's to 90.3 (89.8); max_steps=300 is the 20-minute teacher
    batch_size: int = setting(8, Int(1))  # questions per step (each brings 1 + negatives pairs)
    # N: BM25-mined negatives per question (topped up from other questions' passages)
    negatives: int = setting(3, Int(0))
    negatives_from: str = "mined"     # mined | random: all N drawn from the training passages | mixed: ceil(N/2)
                                      # mined, the rest random (nfcorpus's mined top 30 hold unjudged relevant docs);
                                      # other miners' negatives: train_file= from scripts/mine_negatives.py (the
                                      # hybrid's taught less than BM25's on squad1_open dev: docs/results/teacher.md)
    loss: str = "listwise"            # listwise: softmax CE over the group | bce: pointwise binary CE
    epochs: int = setting(1, Int(0))
    # > 0 overrides epochs (< ~100 steps the new head still scores a group alike)
    max_steps: int = setting(0, Int(0, note="0: epochs decide"))
    max_questions: int = setting(0, Int(0, note="0: all"))  # only the first N training questions (0: all)
    lr: float = setting(5.0e-5, Real(0, 1, lo_open=True))
    weight_decay: float = setting(0.01, Real(0, 10))
    warmup_ratio: float = setting(0.1, Real(0, 1))
    max_grad_norm: float = setting(1.0, Real(note="<= 0: measure only"))
    # > 0: forward length-sorted buckets of N pairs (same loss and gradients, dropout drawn per bucket); 8: level
    # with one forward (0, an earlier default) on squad1_open dev, 0.59x the teacher_train wall on Zen 4
    length_bucket_size: int = setting(8, Int(0, note="0: every pair in one forward"))
    precision: str = "auto"           # auto (bf16 autocast on CPUs with bf16) | fp32 | bf16
    cpu_threads: int = setting(0, Int(0, note="0: torch's default"))  # > 0: torch threads for the run
    seed: int = setting(SEED, Int(0, SEED_MAX))
    log_every: int = setting(10, Int(1))
    save_every: int = setting(50, Int(0, note="0: no checkpoints"))  # checkpoint every N steps and at the end (0: none)
    keep_checkpoints: int = setting(1, Int(0))
    resume: Any = "auto"              # auto | true | false | <checkpoint dir>
    eval_every: int = setting(100, Int(0))  # > 0 (with dev results): validate every N steps; always at the end
    # dev questions reranked per validation (0: all; 200 x top 20: ~25 s)
    val_max_questions: int = setting(200, Int(0, note="0: all"))
    best_metric: str = "auto"         # auto: mrr (QA: 1 / rank of the first answer-bearing passage) | ndcg@10 (qrels)


@dataclass
class RerankScoreConfig:
    k: int = setting(20, Int(1))  # rerank each question's top k (later passages are dropped)
    batch_size: int = setting(32, Int(1))
    precision: str = "auto"
    max_questions: int = setting(0, Int(0, note="0: all"))  # only the first N questions of the results file (0: all)


@dataclass
class RerankModelConfig:
    """``rerank.model``: the encoder to start from and, optionally, LoRA adapters on it. ``rerank.model=<name>``
    (a plain string, as every command and config wrote it before LoRA) is the same as ``rerank.model.name=<name>``;
    without adapters the model is recorded as that string, so runs and pipeline stages recorded before keep their
    fingerprints (`RerankConfig.as_dict`)."""

    name: str = DEFAULT_MODEL_ALIAS   # the offline alias, a hub name or a local dir
    lora: Any = None                  # null: the whole model trains | {r, alpha, dropout, target_modules}: LoRA
                                      # adapters through peft (`dpr.models.lora.LoraSettings`, the dual encoder's
                                      # model.lora); only they and the new head train (typed Any for Hydra: a
                                      # LoraSettings once built)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"rerank.model.name must be a model name or directory, got {self.name!r}")
        self.lora = LoraSettings.coerce(self.lora, "rerank.model.lora")

    @classmethod
    def coerce(cls, value: Any) -> "RerankModelConfig":
        """A string (the name alone), a mapping of ``{name, lora}`` or a RerankModelConfig, as one."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(name=value)
        if isinstance(value, Mapping):
            return strict_from_dict(cls, dict(value), "rerank.model")
        raise ValueError(f"rerank.model must be a model name or {{name, lora}}, got {value!r}")

    def recorded(self) -> Any:
        """What configs, summaries and fingerprints hold: the name alone without LoRA (as before it existed)."""
        if self.lora is None:
            return self.name
        return {"name": self.name, "lora": dataclasses.asdict(self.lora)}


@dataclass
class RerankConfig:
    # the encoder to start from (a string: its name) and LoRA adapters on it (rerank.model.lora): RerankModelConfig
    model: Any = field(default_factory=RerankModelConfig)
    max_length: int = setting(256, Int(8))  # tokens of [CLS] question [SEP] title [SEP] passage [SEP]
    title: bool = True                # put the passage title before its text
    train: RerankTrainConfig = field(default_factory=RerankTrainConfig)
    score: RerankScoreConfig = field(default_factory=RerankScoreConfig)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RerankConfig":
        d = dict(d)
        train = strict_from_dict(RerankTrainConfig, dict(d.pop("train", None) or {}), "rerank.train")
        score = strict_from_dict(RerankScoreConfig, dict(d.pop("score", None) or {}), "rerank.score")
        cfg = strict_from_dict(cls, {**d, "train": train, "score": score}, "rerank")
        cfg.check()
        return cfg

    def __post_init__(self) -> None:
        self.model = RerankModelConfig.coerce(self.model)

    def check(self) -> None:
        """One-line ValueError naming the first key out of its range."""
        self.model = RerankModelConfig.coerce(self.model)  # also after ``cfg.model = "<name>"``
        t, s = self.train, self.score
        check_fields(self, "rerank")  # the rules its fields declare (dpr/config.py)
        check_fields(t, "rerank.train")
        _choice(t, "loss", LOSS_NAMES, "rerank.train")
        _choice(t, "negatives_from", NEGATIVE_SOURCES, "rerank.train")
        _choice(t, "precision", PRECISIONS, "rerank.train")
        _choice(t, "best_metric", ("auto", *METRICS_QA, *METRICS_QRELS), "rerank.train")
        if t.max_steps == 0 and t.epochs == 0:
            raise ValueError("rerank.train.max_steps and rerank.train.epochs are both 0: nothing to train")
        if t.loss == "listwise" and t.negatives == 0:
            raise ValueError("rerank.train.negatives=0: the listwise loss needs at least 1 negative per question")
        check_fields(s, "rerank.score")
        _choice(s, "precision", PRECISIONS, "rerank.score")

    def settings(self) -> dict:
        """What a saved cross-encoder keeps of its inputs (`dpr.rerank.model.SETTINGS_KEYS`)."""
        return {"max_length": self.max_length, "title": self.title}

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["model"] = RerankModelConfig.coerce(self.model).recorded()
        # keys added after teacher runs were recorded: at the value those runs had, they are left out, so
        # the recorded fingerprints still hold
        for key, recorded in (("length_bucket_size", 0), ("negatives_from", "mined")):
            if d["train"][key] == recorded:
                del d["train"][key]
        return d


def _choice(obj: Any, key: str, allowed: tuple, prefix: str) -> None:
    v = getattr(obj, key)
    if v not in allowed:
        raise ValueError(f"{prefix}.{key}={v!r}: must be one of {', '.join(allowed)}")


@dataclass
class RerankCommandSchema:
    """``dpr-rerank``'s whole config (conf/rerank.yaml selects it as ``rerank_schema``)."""

    rerank: RerankConfig = field(default_factory=RerankConfig)
    data: Any = None                  # train: the dataset (conf/data/<name>.yaml) under data_dir
    data_dir: str = "data/prepared"
    train_file: Optional[str] = None  # train: null = <data_dir>/<data.name>/train.json
    output_dir: Optional[str] = None  # train: the cross-encoder, checkpoints, metrics
    dev_results: Optional[str] = None # train: a first stage's dev results (DPR results JSON) to validate on
    overwrite: bool = False           # train: true replaces a finished run in output_dir trained with other
                                      # settings or data (refused otherwise: dpr/trainkit/finished_run.py)
    model_path: Optional[str] = None  # score: the trained cross-encoder (given as model=<dir>)
    results: Optional[str] = None     # score: a first stage's results (DPR results JSON, or a TREC run of data=)
    output: Optional[str] = None      # score: the reranked results file (.trec: a TREC run and its JSON);
                                      # teacher-scores: the scores jsonl
    weight: float = 0.0               # score: minmax(logit) + weight * minmax(first-stage score); 0: the logit
    weight_grid: Any = None           # score: [w, ...] measured on the file (answers or qrels=), the best written
    qrels: Optional[str] = None       # score: qrels TSV of the results' queries (BEIR), for nDCG@10 before/after
    max_negatives: Optional[int] = None  # teacher-scores: negatives scored per question (null: the pipeline's
                                         # default, dpr/rerank/stage_config.py TeacherStageConfig.max_negatives)


def register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="rerank_schema", node=RerankCommandSchema)
