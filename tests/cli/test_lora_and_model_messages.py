"""Clear one-line messages for model settings: an unknown ``model.lora`` key lists LoRA's keys (not the top-level
ones), ``model.lora=5`` says a section goes there, a LoRA run whose base was moved names the base (not Hugging
Face's "Repo id must be in the form ..."), and ``flash_attention_2`` without its package says so (not "unexpected
error", exit 1)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dpr.errors import DataError
from tests.run_command import run_command


def _train(tmp_path: Path, model: Path, *args: str) -> str:
    """The one line ``dpr-train`` (run in this process) refuses ``args`` with."""
    proc = run_command(["dpr-train", "data=squad1_open", f"data_dir={tmp_path / 'd'}", f"output_dir={tmp_path / 'o'}",
                        "model=tiny", f"model.name={model}", *args], cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("dpr-train")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("arg", ["model.lora={r: 4, bogus: 1}", "+model.lora.bogus=1"])
def test_an_unknown_lora_key_lists_loras_keys(tmp_path, tiny_model_dir, arg):
    line = _train(tmp_path, tiny_model_dir, arg)
    assert "config key model.lora.bogus: unknown; known keys: r, alpha, dropout, target_modules" in line


def test_a_number_for_lora_says_a_section_goes_there(tmp_path, tiny_model_dir):
    line = _train(tmp_path, tiny_model_dir, "model.lora=5")
    assert "config key model.lora: expected a section with keys r, alpha, dropout, target_modules (or null), got 5" \
        in line and "subclass" not in line


def test_a_moved_lora_base_is_named(tmp_path, tiny_llama_dir):
    from dpr.models import BiEncoderConfig, build_biencoder, load_biencoder, save_biencoder

    base = tmp_path / "base"
    shutil.copytree(tiny_llama_dir, base)
    model, tok = build_biencoder(BiEncoderConfig(name=str(base), pooling="last", shared=True,
                                                 lora={"r": 2, "alpha": 4, "dropout": 0.0, "target_modules": ["q_proj"]}))
    save_biencoder(model, tok, tmp_path / "run")
    base.rename(tmp_path / "moved")
    with pytest.raises(DataError, match=rf"the LoRA base '{base}' these adapters were trained on is not there any "
                                        r"more \(moved or deleted\)") as err:
        load_biencoder(tmp_path / "run")
    assert "Repo id" not in str(err.value) and "\n" not in str(err.value)
    assert json.loads((tmp_path / "run" / "biencoder.json").read_text())["base_fingerprint"]


def test_flash_attention_without_its_package(tmp_path, tiny_model_dir):
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    from dpr.models.backbone import load_tower

    with pytest.raises(ValueError, match="model.attn_implementation=flash_attention_2 needs the flash_attn package"):
        load_tower(tiny_model_dir, "flash_attention_2")


def test_a_tokenizer_without_pad_or_eos_is_refused_before_training(tmp_path, tiny_llama_dir, tiny_data_dir):
    """Before, such a model trained (exit 0) and then failed at encode and export with transformers' advice."""
    from transformers import AutoTokenizer

    from dpr.models.backbone import load_tokenizer

    model = tmp_path / "no_pad"
    shutil.copytree(tiny_llama_dir, model)
    tok = AutoTokenizer.from_pretrained(str(model))
    tok.pad_token, tok.eos_token = None, None
    tok.save_pretrained(str(model))
    if AutoTokenizer.from_pretrained(str(model)).eos_token is not None:
        pytest.skip("this transformers restores the EOS token from the model's files")
    with pytest.raises(ValueError, match="the tokenizer has neither a padding nor an EOS token"):
        load_tokenizer(model, "last")
    from dpr.training.train import train
    from tests.training.test_resume import tiny_cfg

    cfg = tiny_cfg(model, tiny_data_dir, tmp_path / "run", precision="fp32", max_steps=1, save_every=0)
    cfg["model"]["pooling"] = "last"
    with pytest.raises(ValueError, match="the tokenizer has neither a padding nor an EOS token"):
        train(cfg)
    assert not (tmp_path / "run" / "train_summary.json").exists()


def test_lora_target_modules_not_in_the_model_name_the_ones_that_are(tiny_model_dir):
    """Before: peft's "Target modules ... not found in the base model. Please check the target modules"."""
    from dpr.models import BiEncoderConfig, build_biencoder
    from dpr.models.lora import LoraSettings
    from dpr.rerank.model import build_cross_encoder

    bad = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj"]}
    with pytest.raises(ValueError, match=r"lora.target_modules=\['q_proj'\]: no such module in BertModel; its linear "
                                         r"layers are named dense, key, query, value"):
        build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), lora=bad))
    with pytest.raises(ValueError, match=r"lora.target_modules=\['q_proj'\]: no such module in .*; its linear layers "
                                         r"are named .*query"):
        build_cross_encoder(str(tiny_model_dir), lora=LoraSettings.coerce(bad))
