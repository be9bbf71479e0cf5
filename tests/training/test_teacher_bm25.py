"""The BM25 teacher of ``loss=lexical_distill`` builds the dataset's BM25 index with the run's ``bm25.*`` settings
(dpr-train's and dpr-pipeline's ``bm25`` section), the settings the pipeline's BM25 stages build it with: before,
it used BM25Config's defaults whatever the user set, and the teacher and the pipeline rebuilt each other's index."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import dpr.cli.pipeline  # noqa: F401  registers the groups conf/pipeline.yaml composes
import dpr.cli.train  # noqa: F401  registers the groups conf/train.yaml composes
from dpr import bm25
from dpr.bm25.config import BM25Config, index_settings
from dpr.bm25.index import META_FILE
from dpr.cli.common import CONF_DIR
from dpr.cli.schemas import SCHEMAS, check_config
from dpr.data.dataset import DatasetPaths
from dpr.losses import LexicalDistillLoss, SoftmaxNLLLoss
from dpr.training.config import TrainConfig
from dpr.training.teacher import BM25Teacher, prepare_teacher
from dpr.trainkit.config_dict import plain

from tests.training.test_trainer import tiny_cfg

pytestmark = pytest.mark.usefixtures("one_thread")
USER = {"k1": 1.3, "b": 0.55, "stopwords": "en", "stemmer": "english"}  # not BM25Config's defaults


def _index_meta(root: Path) -> dict:
    return json.loads((root / "bm25_index" / META_FILE).read_text())


def _compose(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def test_the_teacher_builds_the_index_with_the_runs_settings(tiny_data_dir, caplog):
    root = tiny_data_dir / "tiny"
    # the pipeline's bm25 section holds the mining keys beside the index's: they are not the index's settings
    section = {**USER, "k": 100, "num_negatives": 30, "mine": True}
    run = prepare_teacher(LexicalDistillLoss(), TrainConfig(), root, root / "passages.tsv", root / "train.json", [],
                          bm25=section)
    assert isinstance(run.teacher, BM25Teacher)
    assert {k: run.teacher.index.params[k] for k in USER} == USER
    assert _index_meta(root)["params"]["k1"] == 1.3
    # the run's identity records the teacher's settings (a resume with others starts over)
    assert run.fingerprint == {"bm25": USER}
    # the pipeline's BM25 stages then reuse that very index: no rebuild either way
    with caplog.at_level(logging.INFO, logger="dpr.bm25.index"):
        bm25.get_or_build_index(root / "passages.tsv", root / "bm25_index", **index_settings(section))
    assert "reusing BM25 index" in caplog.text and "stale" not in caplog.text


def test_default_settings_and_other_losses_record_nothing(tiny_data_dir):
    root = tiny_data_dir / "tiny"
    args = (root, root / "passages.tsv", root / "train.json", [])
    run = prepare_teacher(LexicalDistillLoss(), TrainConfig(), *args)  # no bm25 section: BM25Config's defaults
    assert {k: run.teacher.index.params[k] for k in ("k1", "b")} == {"k1": BM25Config().k1, "b": BM25Config().b}
    assert run.fingerprint == {}  # recorded only when set: runs of the default settings keep their checkpoints
    assert prepare_teacher(SoftmaxNLLLoss(), TrainConfig(), *args, bm25=USER).fingerprint == {}


def test_dpr_train_has_a_bm25_section_typed_and_ranged_by_bm25config():
    cfg = _compose("train", ["loss=lexical_distill", "bm25.k1=1.3", "bm25.b=0.55"])
    assert plain(cfg.bm25) == USER
    check_config(cfg, SCHEMAS["train"])
    assert plain(_compose("train", [])["bm25"]) == index_settings(None)  # the defaults, from BM25Config
    with pytest.raises(ValueError, match=r"config key bm25.b: 2.0 is out of range; allowed: \[0, 1\]"):
        check_config(_compose("train", ["bm25.b=2.0"]), SCHEMAS["train"])
    with pytest.raises(ValueError, match="config key bm25.k3: unknown"):
        check_config(_compose("train", ["+bm25.k3=1"]), SCHEMAS["train"])


def test_dpr_train_lexical_distill_uses_the_runs_bm25(tiny_model_dir, tiny_data_dir, tmp_path):
    from dpr.training.train import train

    cfg = tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "run", max_steps=2, validate=False, save_every=0,
                   precision="fp32")
    cfg["loss"] = plain(_compose("train", ["loss=lexical_distill"]).loss)
    cfg["bm25"] = dict(USER)
    train(cfg)
    assert _index_meta(tiny_data_dir / "tiny")["params"]["k1"] == 1.3


@pytest.mark.parametrize("loss,k1,want", [
    ("lexical_distill", 1.3, {"bm25": USER}),   # the teacher's settings reach the trainer (and the stage's record)
    ("lexical_distill", None, {}),              # defaults: nothing added, cached train stages stay up to date
    ("softmax_nll", 1.3, {}),                   # no BM25 teacher: the bm25 section is not the trainer's
])
def test_the_pipeline_hands_its_bm25_settings_to_the_trainer(tiny_data_dir, tmp_path, monkeypatch, loss, k1, want):
    import dpr.pipeline as pipeline
    from dpr.stages import StageRunner

    overrides = [f"loss={loss}", f"data_dir={tiny_data_dir}", f"output_dir={tmp_path}"]
    if k1 is not None:
        overrides += [f"bm25.k1={k1}", "bm25.b=0.55"]
    cfg = _compose("pipeline", overrides)
    seen = []

    def fake_train(cfg, ds, train_cfg, start_emb, export_emb, rounds, *args, **kwargs):
        seen.append(OmegaConf.to_container(train_cfg))
        out = Path(train_cfg.output_dir)
        (out / "passage_encoder").mkdir(parents=True)
        (out / "biencoder.json").write_text("{}")

    monkeypatch.setattr(pipeline, "_train_reusing_vectors", fake_train)
    pipeline.train_model_rounds(cfg, DatasetPaths(tiny_data_dir / "tiny"), tmp_path, tmp_path / "model",
                                StageRunner(tmp_path / "stages"))
    assert len(seen) == 1
    assert {k: seen[0][k] for k in ("bm25",) if k in seen[0]} == want
