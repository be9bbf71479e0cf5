"""The re-mining rounds' settings (issue 24): ``remine.*`` (RemineConfig) and ``train.rounds`` (the pipeline's own
train key), their ranges, and the old ``train.remine_*`` keys refused in one line naming the new ones."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import dpr.cli.pipeline  # noqa: F401  registers train_rounds/default and remine_cfg/default
from dpr.cli.common import CONF_DIR
from dpr.negatives.config import RemineConfig, moved_from_train
from dpr.training.config import TrainConfig
from dpr.training.rounds import PipelineTrainConfig, split_rounds


def _pipeline(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="pipeline", overrides=list(overrides))


def test_defaults_and_their_meaning_kept():
    rc = RemineConfig()
    assert (rc.negatives, rc.depth, rc.skip_top, rc.relative_margin, rc.bm25_share) == (30, 200, 0, 0.05, 0.5)
    assert RemineConfig.from_dict(None) == rc == RemineConfig.from_dict({})
    assert rc.as_kwargs() == {"num_negatives": 30, "depth": 200, "skip_top": 0, "relative_margin": 0.05,
                              "bm25_share": 0.5}


@pytest.mark.parametrize("bad,match", [
    ({"negatives": 0}, "remine.negatives must be an integer >= 1, got 0"),
    ({"depth": 0}, "remine.depth must be an integer >= 1"),
    ({"depth": 2.5}, "remine.depth must be an integer"),
    ({"skip_top": -1}, "remine.skip_top must be an integer >= 0"),
    ({"relative_margin": -0.1}, "remine.relative_margin must be a finite number >= 0"),
    ({"relative_margin": float("nan")}, "remine.relative_margin"),
    ({"bm25_share": 2.0}, r"remine.bm25_share must be a finite number in \[0, 1\]"),
    ({"bm25_share": True}, "remine.bm25_share"),
    ({"skip_top": 200}, "remine.skip_top=200 must be < remine.depth=200"),
    ({"skip_top": 5, "depth": 3}, "remine.skip_top=5 must be < remine.depth=3"),
    ({"dept": 10}, r"unknown remine config keys \['dept'\]"),
])
def test_bad_values_refused_in_one_line(bad, match):
    with pytest.raises(ValueError, match=match) as err:
        RemineConfig.from_dict(bad)
    assert "\n" not in str(err.value)


def test_rounds_is_the_pipelines_train_key():
    assert PipelineTrainConfig().rounds == 1 and issubclass(PipelineTrainConfig, TrainConfig)
    assert split_rounds({"rounds": 3, "lr": 1e-3}) == (3, {"lr": 1e-3})
    assert split_rounds({"lr": 1e-3}) == (1, {"lr": 1e-3})  # a train section without it: one round
    for bad in (0, -1, 1.5, "2", True, None):
        with pytest.raises(ValueError, match=r"^train.rounds must be an integer >= 1, got ") as err:
            split_rounds({"rounds": bad})
        assert "\n" not in str(err.value)


def test_the_composed_pipeline_config_types_rounds_and_remine():
    cfg = _pipeline()
    assert OmegaConf.to_container(cfg.remine) == dataclasses.asdict(RemineConfig())
    assert cfg.train.rounds == 1
    cfg = _pipeline("train.rounds=2", "remine.depth=50", "train=long")
    assert cfg.train.rounds == 2 and cfg.remine.depth == 50
    assert (cfg.train.max_steps, cfg.train.frozen_steps) == (400, 248)  # the preset's values survive the merge
    with pytest.raises(Exception, match="train.rounds"):
        _pipeline("train.rounds=abc")
    with pytest.raises(Exception, match="remine_depth"):  # the old key is no train key any more
        _pipeline("train.remine_depth=5")


def test_the_schema_types_the_remine_section():
    from dpr.cli.schemas import SCHEMAS, check_config

    check_config(_pipeline("remine.bm25_share=0.25"), SCHEMAS["pipeline"])
    with pytest.raises(ValueError, match="config key remine.depth"):
        check_config(_pipeline("remine.depth=abc"), SCHEMAS["pipeline"])


def test_old_overrides_name_the_new_key():
    from dpr.cli.argv import refuse_moved
    from dpr.cli.pipeline import MOVED

    assert moved_from_train() == {f"train.remine_{k}": f"remine.{k}"
                                  for k in ("negatives", "depth", "skip_top", "relative_margin", "bm25_share")}
    with pytest.raises(ValueError, match=r"^config key train.remine_depth: unknown; use remine.depth "):
        refuse_moved(["dpr-pipeline", "data=tiny", "+train.remine_depth=5"], MOVED)
    refuse_moved(["dpr-pipeline", "train.rounds=2", "remine.depth=5"], MOVED)  # the new keys pass
