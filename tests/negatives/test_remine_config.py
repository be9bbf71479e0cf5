"""The re-mining rounds' settings: ``remine.*`` (RemineConfig) and ``train.rounds`` (the pipeline's own
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
from tests.run_command import run_as_subprocess


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


def test_the_pipeline_checks_the_remine_section_before_any_stage(tmp_path):
    """The pipeline's schema leaves the section to RemineConfig (as it leaves train to TrainConfig): a bad value is
    one line naming the key, and nothing is prepared or written."""
    import subprocess
    import sys

    from dpr.trainkit.config_dict import plain

    assert RemineConfig.from_dict(plain(_pipeline("remine.bm25_share=0.25").remine)).bm25_share == 0.25
    for override, want in (("remine.depth=abc", "remine.depth must be an integer >= 1, got 'abc'"),
                           ("remine.skip_top=300", "remine.skip_top")):
        proc = run_as_subprocess([sys.executable, "-m", "dpr.cli.pipeline", "data=squad1_open",
                                  f"data_dir={tmp_path / 'data'}", f"output_dir={tmp_path / 'out'}", override],
                                 capture_output=True, text=True, cwd=tmp_path, timeout=120)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and want in lines[0], proc.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "out").exists()


def test_old_overrides_name_the_new_key():
    from dpr.cli.argv import refuse_moved
    from dpr.cli.pipeline import MOVED

    assert moved_from_train() == {f"train.remine_{k}": f"remine.{k}"
                                  for k in ("negatives", "depth", "skip_top", "relative_margin", "bm25_share")}
    with pytest.raises(ValueError, match=r"^config key train.remine_depth: unknown; use remine.depth "):
        refuse_moved(["dpr-pipeline", "data=tiny", "+train.remine_depth=5"], MOVED)
    refuse_moved(["dpr-pipeline", "train.rounds=2", "remine.depth=5"], MOVED)  # the new keys pass
