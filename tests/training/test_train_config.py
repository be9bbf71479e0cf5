"""One source of training defaults: the composed `train` group is TrainConfig's, typed and strict."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dpr.cli.common import CONF_DIR
from dpr.training.config import TrainConfig, register_schema


def _compose(*overrides: str):
    import dpr.cli.train  # noqa: F401  registers the groups conf/train.yaml composes (bm25_cfg)

    register_schema()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


@pytest.mark.parametrize("config_name", ["train", "pipeline"])
def test_yaml_and_dataclass_cannot_disagree(config_name):
    import dpr.cli.train  # noqa: F401  registers the groups conf/train.yaml composes (bm25_cfg)

    register_schema()
    if config_name == "pipeline":
        import dpr.cli.pipeline  # noqa: F401  registers every group the pipeline composes (bm25_cfg, eval_cfg, ...)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name=config_name)
    composed = OmegaConf.to_container(cfg.train, resolve=True)
    defaults = dataclasses.asdict(TrainConfig())
    if config_name == "pipeline":
        # the pipeline's overrides: the untrained dev figures, and the recipe chosen on dev; + its own train.rounds
        from dpr.training.rounds import PipelineTrainConfig

        defaults = {**dataclasses.asdict(PipelineTrainConfig()), "validate_at_start": True, "frozen_steps": 124,
                    "lr": 5e-5}
    assert composed == defaults


def test_values_are_type_checked_and_unknown_keys_refused():
    with pytest.raises(Exception, match="train.lr"):
        _compose("train.lr=abc")
    with pytest.raises(Exception, match="lrr"):
        _compose("train.lrr=1")
    assert _compose("train.lr=3e-5").train.lr == pytest.approx(3e-5)


def test_presets_override_a_few_keys():
    quick = OmegaConf.to_container(_compose("train=quick").train)
    assert quick["max_steps"] == 20 and quick["batch_size"] == 16
    assert quick["lr"] == TrainConfig().lr
    long = OmegaConf.to_container(_compose("train=long").train)  # builds on the pipeline recipe
    assert (long["frozen_steps"], long["max_steps"], long["validate_at_start"]) == (248, 400, True)
    assert long["lr"] == 5e-5
    frozen = OmegaConf.to_container(_compose("train=frozen").train)  # the frozen-index phase alone
    assert (frozen["frozen_steps"], frozen["max_steps"], frozen["epochs"], frozen["batch_size"]) == (124, 0, 0, 64)
    assert frozen["lr"] == 5e-5 and TrainConfig.from_dict(frozen).frozen_steps == 124


def test_auto_settings_follow_the_kind_of_data():
    tc = TrainConfig()
    assert (tc.multi_positive_for("qrels"), tc.multi_positive_for("qa")) == (True, False)
    assert (tc.best_metric_for("qrels"), tc.best_metric_for("qa")) == ("ndcg@10", "avg_rank")
    assert TrainConfig.from_dict({"val_corpus_topk": False}).best_metric_for("qrels") == "avg_rank"
    pinned = TrainConfig.from_dict({"multi_positive": False, "best_metric": "mrr"})
    assert (pinned.multi_positive_for("qrels"), pinned.best_metric_for("qrels")) == (False, "mrr")
    assert _compose("train.multi_positive=true").train.multi_positive is True
    # a metric the dev validation of this kind of data does not compute is refused, not replaced by avg_rank
    assert TrainConfig.from_dict({"best_metric": "top10", "val_topk": [1, 10]}).best_metric_for("qa") == "top10"
    with pytest.raises(ValueError, match="ndcg@10 needs qrels data"):
        TrainConfig.from_dict({"best_metric": "ndcg@10"}).best_metric_for("qa")


@pytest.mark.parametrize("bad,match", [({"batch_size": 0}, "batch_size"),
                                       ({"multi_positive": "yes"}, "multi_positive"),
                                       ({"best_metric": "ndcg@10", "val_corpus_topk": False}, "val_corpus_topk"),
                                       ({"max_steps": 0, "epochs": 0}, "nothing to train"),
                                       ({"best_metric": "accuracy"}, "best_metric='accuracy' is not a dev metric"),
                                       ({"best_metric": "top10"}, "top10' is not a dev metric")])
def test_degenerate_values_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig.from_dict(bad)


# The pipeline's re-mining rounds are no training setting: train.rounds lives in PipelineTrainConfig
# (dpr/training/rounds.py), the remine_* keys are the pipeline's remine section (RemineConfig).
PIPELINE_ONLY = ["rounds", "remine_negatives", "remine_depth", "remine_skip_top", "remine_relative_margin",
                 "remine_bm25_share"]


def test_train_config_has_no_pipeline_keys():
    assert not {f.name for f in dataclasses.fields(TrainConfig)} & set(PIPELINE_ONLY)
    from dpr.training.resume import RESUMABLE_KEYS

    assert not RESUMABLE_KEYS & set(PIPELINE_ONLY)


@pytest.mark.parametrize("key", PIPELINE_ONLY)
def test_pipeline_keys_are_unknown_to_train_config(key):
    with pytest.raises(ValueError, match=rf"^unknown train config keys \['{key}'\]") as err:
        TrainConfig.from_dict({key: 2})
    assert "\n" not in str(err.value)
    with pytest.raises(Exception, match=key):  # dpr-train's composed config refuses it too
        _compose(f"train.{key}=2")


# ---------------------------------------------------------------- every numeric key: refused in one line, or legal
import math  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dpr.config import field_rules, numeric_fields  # noqa: E402
from dpr.models.biencoder import BiEncoderConfig  # noqa: E402

EDGES = [0, -1, 1, 2, 3, 0.5, -0.5, 1e-4, 1e-40, float("nan"), float("inf"), float("-inf"), 1e300, 10**18, -10**18,
         10**400, "abc", "1", True, False, None, [], [1, 5], [0.9, 0.999], [0.9, 1.0], {"a": 1}]
VALUES = st.one_of(st.sampled_from(EDGES), st.integers(-10**6, 10**6), st.floats(),
                   st.lists(st.one_of(st.integers(-3, 30), st.floats()), max_size=3))
# What the docs promise of an accepted value (an independent statement of the ranges, not the table itself)
AT_LEAST_ONE = {"batch_size", "grad_accumulation_steps", "log_every", "print_every", "val_batch_size",
                "corpus_topk", "corpus_sample", "projection_dim", "question_max_length", "passage_max_length"}
FRACTIONS = {"warmup_ratio"}
ANY_SIGN = {"max_grad_norm"}  # <= 0: no clipping


def test_every_numeric_key_has_a_range():
    assert sorted(numeric_fields(TrainConfig)) == sorted(field_rules(TrainConfig))
    assert sorted(numeric_fields(BiEncoderConfig)) == sorted(field_rules(BiEncoderConfig))


def _check_refusal(err: Exception, label: str, key: str, value) -> None:
    msg = str(err)
    assert "\n" not in msg and f"{label}.{key}" in msg, msg
    assert repr(value) in msg or str(value) in msg, msg  # the value as given
    assert "must be" in msg, msg                         # and what is allowed


def _check_legal(key: str, value, annotation: str) -> None:
    items = value if isinstance(value, list) else [value]
    if value is None:
        # null: no projection / the model's own dropout / the whole corpus
        assert key in ("projection_dim", "attention_dropout", "corpus_sample")
        return
    assert items, key
    for v in items:
        assert not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v), (key, value)
        if "int" in annotation:
            assert isinstance(v, int), (key, value)
        if key in AT_LEAST_ONE:
            assert v >= 1, (key, value)
        elif key in FRACTIONS:
            assert 0 <= v <= 1, (key, value)
        elif key == "attention_dropout":
            assert 0 <= v < 1, (key, value)
        elif key == "adam_betas":
            assert 0 <= v < 1 and len(items) == 2, (key, value)
        elif key in ("lr", "adam_eps", "temperature"):
            assert v > 0, (key, value)
        elif key not in ANY_SIGN:
            assert v >= 0, (key, value)


@given(key=st.sampled_from(sorted(field_rules(TrainConfig))), value=VALUES)
def test_train_keys_refuse_bad_numbers_in_one_line(key, value):
    try:
        tc = TrainConfig.from_dict({key: value})
    except ValueError as err:
        _check_refusal(err, "train", key, value)
        return
    assert getattr(tc, key) == value
    _check_legal(key, value, {f.name: f.type for f in dataclasses.fields(TrainConfig)}[key])


@given(key=st.sampled_from(sorted(field_rules(BiEncoderConfig))), value=VALUES)
def test_model_keys_refuse_bad_numbers_in_one_line(key, value):
    try:
        mc = BiEncoderConfig.from_dict({key: value})
    except ValueError as err:
        _check_refusal(err, "model", key, value)
        return
    assert getattr(mc, key) == value
    _check_legal(key, value, {f.name: f.type for f in dataclasses.fields(BiEncoderConfig)}[key])


# Keys cheap to train with on the tiny model: an accepted value must give a run with finite numbers, be
# refused by the trainer in one line naming the key, or stop as diverged naming the step -- never NaN weights.
CHEAP = [("train", k) for k in ("lr", "warmup_ratio", "warmup_steps", "weight_decay", "adam_eps", "adam_betas",
                                "max_grad_norm", "batch_size", "hard_negatives", "length_bucket_size",
                                "grad_cache_chunk_size", "val_hard_negatives", "attention_dropout")] + \
        [("model", k) for k in ("temperature", "question_max_length", "passage_max_length")]


@pytest.mark.usefixtures("one_thread")
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(CHEAP), value=VALUES)
def test_accepted_values_train_to_finite_numbers(where, value, tiny_model_dir, tiny_data_dir):
    from dpr.training.trainer import TrainingDiverged
    from dpr.training.train import train

    group, key = where
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**4 and key.endswith("max_length"):
        value = 512  # a long max length is legal and only slower; keep the example cheap
    cfg = {"model": {"name": str(tiny_model_dir), "question_max_length": 16, "passage_max_length": 32},
           "data": {"name": "tiny", "kind": "qa"}, "logger": {"type": "none"}, "data_dir": str(tiny_data_dir),
           "train": {"batch_size": 4, "max_steps": 2, "print_every": 1000, "save_every": 0, "precision": "fp32",
                     "val_batch_size": 8, "val_hard_negatives": 2},
           "output_dir": tempfile.mkdtemp(dir=tiny_data_dir.parent), "seed": 1}
    cfg[group][key] = value
    try:
        summary = train(cfg)
    except TrainingDiverged as err:
        assert str(err).startswith("training diverged at step ") and "\n" not in str(err)
        return
    except ValueError as err:  # a limit that depends on the data (8 questions, 8 passages): one line, naming
        msg = str(err)           # the key and the value
        if "cannot tell texts apart" in msg:  # e.g. passage_max_length=1: every passage is one token, one vector
            assert "\n" not in msg and "not marked finished" in msg, msg
            return
        assert "\n" not in msg and (f"{group}.{key}" in msg or f"{key}=" in msg) and str(value) in msg, msg
        return
    numbers = [v for v in summary["final_metrics"].values() if isinstance(v, float)]
    assert numbers and all(math.isfinite(v) for v in numbers), summary["final_metrics"]
    from safetensors.torch import load_file

    for f in Path(cfg["output_dir"]).rglob("*.safetensors"):
        assert all(bool(t.isfinite().all()) for t in load_file(f).values()), f


def test_the_validator_never_swaps_a_missing_primary_metric_for_another():
    from dpr.training.validation import DevEncoding, Validator

    v = Validator(None, [], corpus=None, use_answers=True, cfg={}, encoding=DevEncoding(8, 8),
                  primary_metric="top5")
    assert v.metric({"avg_rank": 2.0, "top5": 0.9}) == "top5" and v.greater_is_better
    with pytest.raises(ValueError, match="best_metric='top5': the dev validation gave no such metric"):
        v.metric({"avg_rank": 2.0, "mrr": 0.5, "mrr_ci95": 0.1})
    # with dev examples, a metric this run's validation cannot compute is refused before any step is trained
    dev = [{"question": "q", "answers": ["a"], "positive_ctxs": [{"passage_id": "p"}]}]
    kw = dict(use_answers=True, cfg={"val_topk": [1, 5]}, encoding=DevEncoding(8, 8))
    with pytest.raises(ValueError, match="best_metric='top5': this run's dev validation computes avg_rank, mrr "):
        Validator(None, dev, corpus=None, primary_metric="top5", **kw)  # no corpus: no top-k
    with pytest.raises(ValueError, match="best_metric='ndcg@10'.*computes avg_rank, mrr, top1, top5 "):
        Validator(None, dev, corpus=(["p"], ["t"], [""]), primary_metric="ndcg@10", **kw)  # QA data: no nDCG
    assert Validator(None, dev, corpus=(["p"], ["t"], [""]), primary_metric="top5", **kw).primary_metric == "top5"
    # qrels data: nDCG@10 exists even where the dev examples carry positives only (grade 1)
    qrels_kw = {**kw, "use_answers": False}
    assert Validator(None, dev, corpus=(["p"], ["t"], [""]), primary_metric="ndcg@10", **qrels_kw)


def test_length_bucket_size_auto_is_the_devices_and_fingerprints_as_before():
    """``auto`` (the default) is buckets of 8 on the CPU (what every CPU run did before: the same forwards) and one
    padded forward on a GPU; the data-path keys change no number, so fingerprints (runs, checkpoints, pipeline
    stages) of a CPU run hold exactly what they held before these keys existed."""
    import torch

    from dpr.training.config import without_unset

    tc = TrainConfig()
    assert tc.length_bucket_size == "auto" and tc.bucket_size_for("cpu") == 8
    assert tc.bucket_size_for(torch.device("cuda", 1)) == 0 and TrainConfig(length_bucket_size=3).bucket_size_for("cuda") == 3
    seen = without_unset(dataclasses.asdict(TrainConfig(background_loader=False, token_cache=True)), "cpu")
    assert seen["length_bucket_size"] == 8 and not {"background_loader", "token_cache"} & set(seen)
    assert without_unset(dataclasses.asdict(tc), "cpu") == without_unset(
        dataclasses.asdict(TrainConfig(length_bucket_size=8)), "cpu")
    for bad in (-1, "eight", 2.5, True):
        with pytest.raises(ValueError, match="length_bucket_size"):
            TrainConfig.from_dict({"length_bucket_size": bad})
    assert TrainConfig.from_dict({"length_bucket_size": "auto"}).length_bucket_size == "auto"
