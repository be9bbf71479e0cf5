"""Re-mining rounds and frozen-index training through the pipeline, on a tiny random model."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dpr.eval.has_answer import has_answer

from tests.system.test_pipeline import _pipeline


@pytest.mark.slow
def test_two_rounds_remine_from_the_trained_model(tiny_data_dir, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, "train.rounds=2",
                     "train.corpus_negatives=true", "remine.negatives=3", "remine.relative_margin=0.0",
                     "remine.bm25_share=0.0", in_process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seconds = json.loads((out / "timings.json").read_text())["seconds"]
    assert {"train_round1", "encode_round1", "index_round1", "remine_round2", "train_round2"} <= set(seconds)
    assert (out / "rounds" / "round1" / "model" / "biencoder.json").is_file()
    assert (out / "model" / "biencoder.json").is_file()  # the last round is the pipeline's model

    mined = json.loads((out / "rounds" / "round2" / "train.json").read_text())
    stats = json.loads((out / "rounds" / "round2" / "train.stats.json").read_text())
    assert stats["questions"] == len(mined) and stats["kept"] > 0
    for ex in mined:
        positives = {c["passage_id"] for c in ex["positive_ctxs"]}
        assert ex["hard_negative_ctxs"], ex["question"]
        for neg in ex["hard_negative_ctxs"]:
            assert neg["passage_id"] not in positives
            assert not has_answer(ex["answers"], neg["text"])
    summary = json.loads((out / "model" / "train_summary.json").read_text())
    assert summary["config"]["train_file"].endswith("round2/train.json")
    assert summary["config"]["model"]["name"].endswith("round1/model")  # round 2 continues from round 1
    # the rounds are the pipeline's: in the summary (for the model card), never in the trainer's config
    assert summary["rounds"] == 2 and not {"rounds", "remine_depth"} & set(summary["config"]["train"])
    assert "| re-mining rounds | 2 |" in (out / "model" / "README.md").read_text()
    rows = [json.loads(line) for line in (out / "model" / "metrics.jsonl").read_text().splitlines()]
    assert [r["frozen"] for r in rows] == [True, True, False, False, False, False]
    assert all("masked" in r for r in rows)


@pytest.mark.slow
def test_until_train_stops_before_the_trained_model_meets_the_test_split(tiny_data_dir, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, "until=train", in_process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "model" / "train_summary.json").is_file()  # the dev figures of the kept weights
    seconds = json.loads((out / "timings.json").read_text())["seconds"]
    assert "train" in seconds and not any(k.startswith(("dense_retrieve", "dense_encode", "hybrid")) for k in seconds)
    assert not (out / "dense").exists() and not (out / "eval").exists() and not (out / "hybrid").exists()

    bad = _pipeline(tiny_data_dir, tiny_model_dir, tmp_path / "bad", "until=eval", in_process=True)
    assert bad.returncode != 0 and "until must be null" in bad.stderr
    assert not (tmp_path / "bad" / "bm25").exists()  # refused before any work


class _Recorder:
    """A StageRunner that records each stage's parameters and runs nothing."""

    def __init__(self) -> None:
        self.params: dict = {}

    def run(self, name, fn, *, outputs, inputs=(), params=None, **how) -> bool:
        self.params[name] = params
        return False


@pytest.mark.parametrize("rounds", [1, 2])
def test_stage_parameters_hold_the_remine_settings_and_the_train_stage_not(rounds, tmp_path):
    """The train stages record TrainConfig's keys alone (rounds and remine.* left them: the one
    fingerprint migration), the remine stages record the remine settings."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import dpr.cli.pipeline  # noqa: F401  registers the groups conf/pipeline.yaml selects
    from dpr.cli.common import CONF_DIR
    from dpr.data.dataset import DatasetPaths
    from dpr.negatives.config import RemineConfig
    from dpr.pipeline import train_model_rounds
    from dpr.training.config import TrainConfig, without_unset

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="pipeline", overrides=[f"train.rounds={rounds}", "remine.depth=50",
                                                         f"data_dir={tmp_path}", f"output_dir={tmp_path}"])
    stages = _Recorder()
    train_model_rounds(cfg, DatasetPaths.of(tmp_path, "squad1_open"), tmp_path, tmp_path / "model", stages)
    composed = OmegaConf.to_container(cfg.train, resolve=True)
    want_train = {k: v for k, v in composed.items() if k != "rounds"}
    assert set(want_train) == {f.name for f in dataclasses.fields(TrainConfig)}
    want_train = without_unset(want_train)  # keys recorded only when set (train.attention_dropout) left out while null
    if rounds == 1:
        assert list(stages.params) == ["train"]
        assert stages.params["train"]["train"] == want_train  # the default recipe, as before, less the six keys
        return
    assert list(stages.params) == ["train_round1", "encode_round1", "index_round1", "remine_round2", "train_round2"]
    assert stages.params["remine_round2"] == {"remine": dataclasses.asdict(RemineConfig(depth=50))}
    for name in ("train_round1", "train_round2"):
        assert stages.params[name]["train"] == want_train and "remine" not in stages.params[name]
