"""The extractive reader's settings (`dpr.reader`): the one source of their defaults, types and ranges, for
``dpr-reader train|eval`` and ``dpr-pipeline reader=true`` (both read them as ``reader_cfg``).

Sized for squad1_open on a 2-core CPU (bf16 autocast where the CPU has it): see docs/results/reader.md. Registered
in Hydra's ConfigStore (`register_schema`) as ``reader_cfg/default``, which conf/reader.yaml and conf/pipeline.yaml
select; the commands' schemas (`dpr.cli.schemas`) type the composed ``reader_cfg`` with `ReaderConfig`, and
`dpr.cli.ranges.check_config_ranges` checks the ranges carried in its fields' metadata (``ranged``).

The group is ``reader_cfg``, not ``reader``: ``dpr-pipeline reader=true`` would then be read as a group choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from dpr.checks import INT32_MAX, MAX_BATCH, MAX_K, MAX_LENGTH, MAX_THREADS, MAX_WEIGHT, SEED, SEED_MAX
from dpr.config import ranged, ranged_list, register_defaults


@dataclass
class ReaderTrainConfig:
    batch_size: int = ranged(8, 1, MAX_BATCH)  # questions per step
    # passages without the answer per question (hard_negative_ctxs first; > 0 trains the relevance head).
    # Dev: 0 at lr 2e-4 beat 1 at 1e-4 / 2e-4 (docs/results/reader.md)
    negatives: int = ranged(0, 0, 10_000, note="0: no relevance training")
    epochs: int = ranged(1, 1, INT32_MAX, note="used when max_steps = 0")
    # > 0 overrides epochs: 400 x 8 = 3,200 of squad1_open's 7,945 usable questions (<= 20 min on a busy 2-core CPU)
    max_steps: int = ranged(400, 0, INT32_MAX, note="0: epochs decide")
    # use only the first N training questions (0: all)
    max_questions: int = ranged(0, 0, INT32_MAX, note="0: all")
    lr: float = ranged(2.0e-4, 1e-12, 1.0, note="> 0")
    weight_decay: float = ranged(0.01, 0, 1)
    warmup_ratio: float = ranged(0.1, 0, 1)
    max_grad_norm: float = ranged(1.0, 0, 1e6, note="0: no clipping")
    precision: str = "auto"  # auto (bf16 autocast on CPUs with bf16) | bf16 | fp32
    cpu_threads: int = ranged(0, 0, MAX_THREADS, note="0: torch's default")  # > 0: torch threads for the run
    seed: int = ranged(SEED, 0, SEED_MAX)
    log_every: int = ranged(20, 1, INT32_MAX)
    # checkpoint every N steps and at the end (0: none)
    save_every: int = ranged(200, 0, INT32_MAX, note="0: no checkpoints")
    keep_checkpoints: int = ranged(1, 0, 10_000, note="0: keep all")
    # auto: continue from output_dir's latest checkpoint | true | false | <dir> (Any: a bool or a path)
    resume: Any = "auto"


@dataclass
class ReaderEvalConfig:
    # open-domain: read the top k of each results file
    ks: List[int] = ranged_list(1, MAX_K, default=lambda: [1, 5, 20])
    max_answer_length: int = ranged(30, 1, MAX_LENGTH)  # tokens
    n_best: int = ranged(20, 1, 10_000)  # start and end candidates per window
    # logit: start + end logit | log_prob: log P(start) + log P(end) in its window (dev: far worse open-domain
    # without relevance training, docs/results/reader.md)
    span_score: str = "logit"
    # answer score across passages = span score + passage_weight * relevance logit
    passage_weight: float = ranged(1.0, 0, MAX_WEIGHT)
    #   - rank_weight * log(1 + retriever rank): the retriever's order as a prior (open domain only; dev: EM no
    #   longer falls with k)
    rank_weight: float = ranged(2.0, 0, MAX_WEIGHT)
    batch_size: int = ranged(32, 1, MAX_BATCH)
    precision: str = "auto"
    # open-domain: only the first N questions (0: all; reading 20 passages each is slow on CPU)
    max_questions: int = ranged(0, 0, INT32_MAX, note="0: all")


@dataclass
class ReaderConfig:
    """all-MiniLM-L6-v2 + start/end head + passage relevance head."""

    model: str = "all-MiniLM-L6-v2"  # encoder: the offline alias, a hub name or a local HF directory
    # tokens per window ([CLS] question [SEP] title [SEP] passage [SEP])
    max_length: int = ranged(256, 8, MAX_LENGTH, note="and <= the encoder's positions")
    stride: int = ranged(64, 0, MAX_LENGTH)  # tokens shared by neighbouring windows of a long passage
    max_question_length: int = ranged(64, 1, MAX_LENGTH)
    title: bool = True  # put the passage title after the question (DPR's reader does)
    train: ReaderTrainConfig = field(default_factory=ReaderTrainConfig)
    eval: ReaderEvalConfig = field(default_factory=ReaderEvalConfig)


def register_schema() -> None:
    """``reader_cfg/default``: ReaderConfig's defaults (nested ``train`` and ``eval`` included), for
    conf/reader.yaml and conf/pipeline.yaml to select."""
    register_defaults("reader_cfg", "default", ReaderConfig)
