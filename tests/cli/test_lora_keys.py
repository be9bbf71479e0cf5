"""LoRA is typed the way users type it: ``model.lora.r=16`` (and every other ``model.lora.<key>``, the
cross-encoder's ``rerank.model.lora.<key>`` too) works from the command line, beside the ``{...}`` form; null or
``r: 0`` means no adapters."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dpr.cli.argv import hydra_argv, lora_key_overrides
from dpr.models.biencoder import BiEncoderConfig
from dpr.models.lora import LoraSettings
from tests.run_command import run_as_subprocess


def test_lora_keys_are_forced_at_any_depth_and_nothing_else_is():
    given = ["model.lora.r=16", "+model.lora.alpha=8", "rerank.model.lora.dropout=0.1",
             "teacher_cfg.rerank.model.lora.r=4", "model.lora={r: 16}", "model.lora=null", "~model.lora.r",
             "model.name=x", "train.lora_r=3", "model.lora"]
    assert lora_key_overrides(given) == [
        "++model.lora.r=16", "++model.lora.alpha=8", "++rerank.model.lora.dropout=0.1",
        "++teacher_cfg.rerank.model.lora.r=4", "model.lora={r: 16}", "model.lora=null", "~model.lora.r",
        "model.name=x", "train.lora_r=3", "model.lora"]


def test_hydra_argv_forces_lora_keys_before_the_flags():
    assert hydra_argv(["dpr-train", "model.lora.r=16", "--cfg", "job"]) == ["dpr-train", "++model.lora.r=16",
                                                                            "--cfg", "job"]


@pytest.mark.parametrize("value", [None, {"r": 0}, {"r": 0, "alpha": 8}, LoraSettings(r=0)])
def test_null_or_rank_zero_means_no_adapters(value):
    assert LoraSettings.coerce(value) is None
    assert BiEncoderConfig(name="x", lora=value).lora is None
    assert BiEncoderConfig(name="x", lora=value).to_dict() == BiEncoderConfig(name="x").to_dict()


def test_a_rank_key_alone_keeps_the_other_defaults():
    s = LoraSettings.coerce({"r": 8})
    assert (s.r, s.alpha, s.dropout, s.target_modules) == (8, 32.0, 0.05, ["all-linear"])
    with pytest.raises(ValueError, match=r"^rerank\.model\.lora\.r must be an integer in \[0, 4096\]"):
        LoraSettings.coerce({"r": -1}, "rerank.model.lora")


def test_the_command_line_composes_lora_keys_on_a_null_and_on_a_preset():
    """One command per preset, its main in-process (``--cfg job`` prints the composed config without running)."""
    env = {**os.environ, "WANDB_MODE": "offline"}
    script = os.path.join(os.path.dirname(sys.executable), "dpr-train")
    for preset, keys, expect in (("tiny", ["model.lora.r=16", "model.lora.alpha=8"], ["r: 16", "alpha: 8"]),
                                 ("llama", ["model.lora.r=8"], ["r: 8", "alpha: 32", "- q_proj"])):
        out = run_as_subprocess([script, f"model={preset}", *keys, "--cfg", "job"], capture_output=True, text=True,
                                env=env, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        lora = out.stdout.split("  lora:\n", 1)[1].split("\ndata:", 1)[0]
        for line in expect:
            assert line in lora, lora
