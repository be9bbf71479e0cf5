"""One source of training defaults: the composed `train` group is TrainConfig's, typed and strict."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dpr.cli.common import CONF_DIR
from dpr.training.config import TrainConfig, register_schema


def _compose(*overrides: str):
    register_schema()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


@pytest.mark.parametrize("config_name", ["train", "pipeline"])
def test_yaml_and_dataclass_cannot_disagree(config_name):
    register_schema()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name=config_name)
    composed = OmegaConf.to_container(cfg.train, resolve=True)
    defaults = dataclasses.asdict(TrainConfig())
    if config_name == "pipeline":
        # the pipeline's overrides: the untrained dev figures, and the recipe chosen on dev
        defaults.update(validate_at_start=True, frozen_steps=124, lr=5e-5)
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


@pytest.mark.parametrize("bad,match", [({"batch_size": 0}, "batch_size"), ({"rounds": 0}, "rounds"),
                                       ({"multi_positive": "yes"}, "multi_positive"),
                                       ({"best_metric": "ndcg@10", "val_corpus_topk": False}, "val_corpus_topk"),
                                       ({"max_steps": 0, "epochs": 0}, "nothing to train"),
                                       ({"remine_bm25_share": 2.0}, "remine_bm25_share")])
def test_degenerate_values_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig.from_dict(bad)
