"""The ``train`` config group: one dataclass is the schema *and* the one source of defaults.

``conf/train/default.yaml`` only selects this schema (registered in Hydra's ConfigStore as
``train/schema``), so the YAML and the dataclass cannot disagree, values are type-checked when Hydra
composes the config (``train.lr=abc`` is an error naming the key), and calling :func:`train` from
Python without Hydra gets the same defaults as the CLI. Presets (``conf/train/quick.yaml``, ``long.yaml``)
override a few keys on top of it.

Defaults are sized for the pipeline: squad1_open (7,983 training questions) with MiniLM on a 2-core CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Mapping, Optional

from dpr.config import Int, Real, check_fields, recorded_later, setting, strict_from_dict, without_recorded_later
from dpr.training.dev_metrics import find_metric, metric_names
from dpr.trainkit.optim import OPTIMIZER_IMPLS  # AdamW's implementations (train.optimizer_impl)

if TYPE_CHECKING:
    import torch


@dataclass
class TrainConfig:
    """What one training run does. Unknown keys are an error (a typo must not silently train with defaults)."""

    # --- batches: batch_size x world size questions per step = the in-batch pool (x (1 + H) passages)
    batch_size: int = setting(32, Int(1))  # questions per device per micro-batch
    hard_negatives: int = setting(1, Int(0))  # H: BM25/mined negatives per question besides the in-batch ones
    epochs: int = setting(1, Int(0, note="0: train.max_steps decides"))  # full passes over the training questions
    # > 0 overrides epochs (0: train.epochs full passes)
    max_steps: int = setting(100, Int(0, note="0: train.epochs full passes"))
    shuffle: bool = True  # a seeded permutation of the questions per epoch (false: file order)
    shuffle_positives: bool = False      # False: each question's first positive (DPR); True: one drawn per epoch
    shuffle_hard_negatives: bool = True  # DPR shuffles the negatives per epoch, then takes the first H
    # a question's negative_ctxs join its hard-negative draw after its hard_negative_ctxs (null: yes, as always;
    # false: hard_negative_ctxs only, DPR's NQ recipe, other_negatives: 0)
    other_negatives: bool | None = setting(None, recorded_before=None)
    dedup_positives: bool = True         # no two questions with the same positive passage in a batch
    topic_batches: bool = False          # a batch's questions share their positive's title (TAS-B topic-aware
                                         # sampling): the in-batch negatives are passages of the same article
    # --- false negatives (dpr/training/masks.py)
    multi_positive: Any = "auto"         # every judged-relevant passage in the pool is a positive (auto: qrels data)
    mask_answers: bool = True            # QA: passages containing the question's answer are not its negatives
    # --- corpus negatives / frozen index (dpr/training/corpus_negatives.py)
    # the first N steps train the question tower only, against the cached corpus
    frozen_steps: int = setting(0, Int(0, note="0: none"))
    corpus_negatives: bool = False       # two-tower steps also score every question against the cached corpus
    # re-encode the cached corpus every N steps (0: at start and at validations)
    corpus_refresh_every: int = setting(0, Int(0, note="0: at start and at validations"))
    # whole corpus as candidates up to this size, else FAISS top-k
    corpus_max_passages: int = setting(200_000, Int(0, note="0: always FAISS top-k candidates"))
    corpus_topk: int = setting(200, Int(1))  # FAISS candidates per question above corpus_max_passages
    # > 0: the frozen-index phase and corpus negatives use a seeded sample of
    # this many passages (always with every passage the training questions
    # name), not the whole corpus: their memory and time no longer grow with
    # it (null: the whole corpus up to 500,000 passages, a sample of 500,000
    # above: dpr/training/corpus_sample.py)
    corpus_sample: int | None = setting(
        None, Int(1, optional=True, note="null: the whole corpus up to 500,000 passages"), recorded_before=None)
    # --- partial fine-tuning (dpr/models/freeze.py)
    # the passage tower's embeddings + first N layers get no gradient
    # (separate towers): its backward stops at layer N, a cheaper step
    passage_frozen_layers: int = setting(0, Int(0, note="0: none frozen"))
    # --- optimisation
    # reals beyond these bounds are no learning rate: AdamW diverges at once, or torch cannot even apply them
    # in fp32 ("value cannot be converted to type float without overflow" at lr 1e300)
    lr: float = setting(2.0e-5, Real(0, 1, lo_open=True))  # AdamW's peak learning rate (linear warm-up and decay)
    # AdamW multiplies the weights by (1 - lr x weight_decay)
    weight_decay: float = setting(0.01, Real(0, 1))
    # beta = 1: Adam's bias correction divides by 0
    adam_betas: List[float] = setting(rule=Real(0, 1, hi_open=True, count=(2, 2)), factory=lambda: [0.9, 0.999])
    adam_eps: float = setting(1.0e-8, Real(0, 1, lo_open=True))  # AdamW's epsilon
    warmup_steps: int = setting(0, Int(0, note="0: train.warmup_ratio decides"))  # > 0 wins over warmup_ratio
    warmup_ratio: float = setting(0.1, Real(0, 1))  # share of the steps warming up (when warmup_steps is 0)
    max_grad_norm: float = setting(2.0, Real(note="<= 0: no clipping"))  # DPR's clipping; <= 0: off
    optimizer_impl: str = "auto"         # AdamW's kernels: auto (fused on CUDA, foreach elsewhere) | plain |
                                         # foreach | fused (same update; rounding differs; a run may resume under
                                         # another one)
    grad_accumulation_steps: int = setting(1, Int(1))  # averages gradients over micro-batches; adds NO negatives
    # > 0: gradient cache: the same batch and gradients in chunks
    grad_cache_chunk_size: int = setting(0, Int(0, note="0: off"))
    length_bucket_size: Any = "auto"     # > 0: two-tower steps encode length-sorted buckets of N texts, each padded
                                         # only to its own longest (same vectors, ~0.63x the tokens on squad1_open);
                                         # 0: one padded forward per tower; auto: the device's (bucket_size_for)
    background_loader: bool | None = None  # null/true: batches, masks and teacher scores built in a thread ahead of
                                         # the step (dpr/training/loader.py; the same batches); false: inline
    token_cache: bool | None = None      # null/true: the training file tokenised once, cached beside it
                                         # (dpr/models/token_cache.py; the same token ids); false: per batch
    # attention-probability dropout of both towers while training (null: the
    # model's own; 0: no masks, SDPA's fused kernel); the saved config keeps the
    # model's (dpr/models/dropout.py)
    attention_dropout: float | None = setting(
        None, Real(0, 1, hi_open=True, optional=True, note="null: the model's own"), recorded_before=None)
    # Matryoshka (dpr/losses/matryoshka.py): the loss summed over these prefix sizes of the vectors (e.g. [384, 192,
    # 96, 48]; null: off), each weighted by matryoshka_weights (null: 1 each)
    matryoshka_dims: Optional[List[int]] = setting(None, recorded_before=None)
    # one weight per matryoshka_dims size (null: 1 each)
    matryoshka_weights: Optional[List[float]] = setting(None, recorded_before=None)
    # > 0: + this weight x KL of each smaller prefix's softmax over the pool to the largest size's
    # (self-distillation; null: off)
    matryoshka_distill: Optional[float] = setting(None, recorded_before=None)
    # pca: the projection (model.projection_dim) starts as the training passages' principal directions, largest
    # first (a rotation at the model's size: same scores, ordered coordinates; dpr/training/projection_init.py)
    projection_init: Optional[str] = setting(None, recorded_before=None)
    precision: str = "auto"              # auto | fp32 | bf16 | fp16 (fp16: CUDA only, with loss scaling)
    deterministic: bool = False          # torch deterministic kernels on GPU (CPU runs are deterministic already)
    # > 0: torch threads for the run (0: torch's default)
    cpu_threads: int = setting(0, Int(0, 4096, note="0: torch's default"))
    # --- logging, checkpoints
    log_every: int = setting(1, Int(1))  # a metrics.jsonl row every N steps (and the last)
    print_every: int = setting(50, Int(1))  # a progress line in the log every N steps
    # checkpoint every N steps and at the end (0: none; a killed run restarts)
    save_every: int = setting(50, Int(0, note="0: no checkpoints"))
    # each MiniLM checkpoint is ~270 MB (weights + AdamW moments)
    keep_checkpoints: int = setting(1, Int(0, note="0: keep all"))
    resume: Any = "auto"                 # auto | true | false | <checkpoint dir>
    # --- validation on dev (dpr/training/validation.py)
    validate: bool = True  # validate on dev (false: no dev figures, the last weights kept)
    validate_at_start: bool = False      # also validate the starting weights (step 0; they compete for best)
    # > 0: validate every N steps too (always: each epoch end and the last step)
    eval_every: int = setting(0, Int(0, note="0: epoch ends and the last step only"))
    val_batch_size: int = setting(64, Int(1))  # texts per forward when validating
    val_max_questions: int = setting(0, Int(0, note="0: all"))  # dev questions used (0: all)
    val_hard_negatives: int = setting(30, Int(0))  # per dev question in DPR's average-rank pool
    val_corpus_topk: bool = True         # top-k accuracy against the whole corpus
    val_topk: List[int] = setting(rule=Int(1, count=(1, None)), factory=lambda: [1, 5, 20])  # dev top-k reported
    val_corpus_max_passages: int = setting(500_000, Int(0, note="0: no limit"))  # corpus read for dev top-k
    best_metric: str = "auto"            # picks the saved weights (a registered dev metric, which says whether
                                         # lower is better: dpr/training/dev_metrics.py);
                                         # auto: ndcg@10 on qrels data, avg_rank on QA data
    # --- teacher scores (dpr/training/teacher_scores.py: e.g. a cross-encoder's, for loss=kl_distill|margin_mse)
    teacher_scores: str = ""             # the scores file ("": <data_dir>/<name>/teacher_scores.jsonl where needed)
    teacher_denoise: bool = False        # drop hard negatives the teacher scores above (positive - margin)
    # in teacher-score units, >= 0 (dpr/training/denoise.py)
    teacher_denoise_margin: float = setting(0.0, Real(0, note="0: drop negatives scored above the positive"))
    teacher_scored_negatives: bool = True  # a loss that learns from the scores file draws hard negatives among the
                                         # passages the teacher scored (an unscored one adds nothing to KL/Margin-MSE)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TrainConfig":
        """Build and check: every numeric key against the rules its fields declare (type, finiteness, range), then
        the choices and the keys that constrain each other. One line naming the first bad key."""
        tc = strict_from_dict(cls, d, "train")
        check_fields(tc, "train")
        if tc.precision not in ("auto", "fp32", "bf16", "fp16"):
            raise ValueError(f"train.precision must be auto, fp32, bf16 or fp16; got {tc.precision!r}")
        if tc.optimizer_impl not in OPTIMIZER_IMPLS:
            raise ValueError(f"train.optimizer_impl must be one of {', '.join(OPTIMIZER_IMPLS)}; got "
                             f"{tc.optimizer_impl!r}")
        bucket = tc.length_bucket_size
        if bucket != "auto" and (isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 0):
            raise ValueError(f"train.length_bucket_size must be auto or an integer >= 0 (0: off); got {bucket!r}")
        if tc.multi_positive not in ("auto", True, False):
            raise ValueError(f"train.multi_positive must be auto, true or false; got {tc.multi_positive!r}")
        if not isinstance(tc.best_metric, str):
            raise ValueError(f"train.best_metric must be a metric name or auto, got {tc.best_metric!r}")
        known = ("auto", *metric_names(tc.val_topk))  # the registered dev metrics (dpr/training/dev_metrics.py)
        if tc.best_metric not in known:  # the trainer would otherwise keep the weights by a metric nobody asked for
            raise ValueError(f"train.best_metric={tc.best_metric!r} is not a dev metric; one of {', '.join(known)} "
                             "(top<k>: k from train.val_topk)")
        metric = find_metric(tc.best_metric, tc.val_topk)
        if metric is not None and metric.needs_corpus and not tc.val_corpus_topk:
            raise ValueError(f"train.best_metric={tc.best_metric} needs train.val_corpus_topk=true")
        if tc.matryoshka_weights is not None and not tc.matryoshka_dims:
            raise ValueError("train.matryoshka_weights needs train.matryoshka_dims (the sizes they weigh)")
        if tc.matryoshka_distill is not None and not tc.matryoshka_dims:
            raise ValueError("train.matryoshka_distill needs train.matryoshka_dims (the sizes it distils between)")
        if tc.matryoshka_dims:  # distinct sizes, one weight each
            from dpr.losses.matryoshka import MatryoshkaLoss

            MatryoshkaLoss(None, tc.matryoshka_dims, tc.matryoshka_weights, tc.matryoshka_distill)
        if tc.projection_init is not None:
            from dpr.training.projection_init import PROJECTION_INITS

            if tc.projection_init not in PROJECTION_INITS:
                raise ValueError(f"train.projection_init must be null or one of {', '.join(PROJECTION_INITS)}; got "
                                 f"{tc.projection_init!r}")
            if tc.frozen_steps > 0:
                raise ValueError("train.projection_init needs train.frozen_steps=0: the frozen-index steps score "
                                 "against passage vectors encoded before the projection was set")
        if tc.max_steps <= 0 and tc.epochs <= 0 and tc.frozen_steps <= 0:
            raise ValueError("zero training steps (nothing to train): set train.max_steps, train.epochs or "
                             "train.frozen_steps > 0")
        return tc

    def bucket_size_for(self, device: "torch.device | str") -> int:
        """``length_bucket_size`` on ``device``: auto = buckets of :data:`CPU_BUCKET_SIZE` rows on the CPU (what
        every CPU run did before auto existed: the same forwards, the same numbers), one padded forward per tower
        (0) on an accelerator, where a forward's cost hardly grows with its padding but each launch costs."""
        return resolve_bucket_size(self.length_bucket_size, device)

    def multi_positive_for(self, kind: str) -> bool:
        """``multi_positive`` for a dataset of ``kind`` (qa | qrels): auto = on for qrels data, where a
        query has many judged-relevant documents (chosen on nfcorpus dev; see README), off for QA."""
        return kind == "qrels" if self.multi_positive == "auto" else bool(self.multi_positive)

    def best_metric_for(self, kind: str) -> str:
        """``best_metric`` for a dataset of ``kind``: auto = dev nDCG@10 on qrels data (what is reported
        there; needs ``val_corpus_topk``), DPR's average rank on QA data."""
        metric = find_metric(self.best_metric, self.val_topk)
        if metric is not None and metric.qrels_only and kind != "qrels":
            raise ValueError(f"train.best_metric={self.best_metric} needs qrels data (graded judgements); QA data has "
                             "avg_rank, mrr and top<k>")
        if self.best_metric != "auto":
            return self.best_metric
        return "ndcg@10" if kind == "qrels" and self.val_corpus_topk else "avg_rank"



CPU_BUCKET_SIZE = 8  # length_bucket_size=auto on the CPU (~0.63x the tokens of one padded forward on squad1_open)


def resolve_bucket_size(value: Any, device: "torch.device | str") -> int:
    """``train.length_bucket_size`` as an integer on ``device`` (see :meth:`TrainConfig.bucket_size_for`)."""
    if value != "auto":
        return int(value)
    return CPU_BUCKET_SIZE if str(device).split(":")[0] == "cpu" else 0


# Keys that never change a run's numbers (how its data is fed): left out of the run's and the stages' fingerprints.
NOT_FINGERPRINTED = frozenset({"background_loader", "token_cache"})


def without_unset(train: Mapping[str, Any], device: "torch.device | str | None" = None) -> dict[str, Any]:
    """A ``train`` mapping as fingerprints see it: the keys added after runs were recorded (the fields declared with
    ``recorded_before``: `dpr.config.recorded_later`) left out while null, so runs, checkpoints and stages made
    before a key existed stay the same run; the :data:`NOT_FINGERPRINTED` keys always; and
    ``length_bucket_size=auto`` as the integer it is on ``device`` (this process's device where None): on the CPU 8,
    as recorded before auto existed, so those runs and stages stay."""
    out = {k: v for k, v in without_recorded_later(train, recorded_later(TrainConfig)).items()
           if k not in NOT_FINGERPRINTED}
    if out.get("length_bucket_size") == "auto":
        if device is None:
            from dpr.distributed import device as this_device

            device = this_device()
        out["length_bucket_size"] = resolve_bucket_size("auto", device)
    return out


def register_schema() -> None:
    """Register :class:`TrainConfig` as ``train/schema`` so conf/train/*.yaml can extend it, BiEncoderConfig's
    defaults as ``model_base/default`` and the run's seed as ``seed_cfg/default``."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="train", name="schema", node=TrainConfig)
    # model_base/default: BiEncoderConfig's defaults, under every conf/model preset (which states only what differs,
    # and always its model name: a preset's `name: ???` must stay required, which a merge over a name would lose)
    import dataclasses

    from dpr.config import register_defaults
    from dpr.models.biencoder import BiEncoderConfig

    keys = [f.name for f in dataclasses.fields(BiEncoderConfig) if f.name != "name"]
    register_defaults("model_base", "default", BiEncoderConfig, keys=keys)
    # seed_cfg/default: the run's seed, `dpr.checks.SEED`, placed at the root by conf/train.yaml and conf/pipeline.yaml
    # (`- seed_cfg@_global_: default`), so no YAML restates its value and `seed=7` overrides it as before
    from dpr.checks import SEED

    ConfigStore.instance().store(group="seed_cfg", name="default", node={"seed": SEED})
