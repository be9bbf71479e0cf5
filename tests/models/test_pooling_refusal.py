"""Pooling settings under which vectors cannot tell texts apart are refused before training: ``pooling=cls`` on a
decoder-only model (its first token sees nothing after it; before: 2 distinct vectors for 200 passages, exit 0) and
``cls`` with left padding."""

from __future__ import annotations

import pytest
import torch

from dpr.models import BiEncoderConfig, build_biencoder
from dpr.models.pooling import pool
from tests.run_command import run_command


def test_why_cls_on_a_decoder_collapses(tiny_llama_dir):
    """The first token's state of a causal model depends on the first token only."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(tiny_llama_dir)).eval()
    ids = torch.tensor([[5, 17, 23, 42], [5, 99, 3, 8]])
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    first = pool(hidden, torch.ones_like(ids), "cls")
    assert torch.allclose(first[0], first[1], atol=1e-6)  # two different texts, one vector
    assert not torch.allclose(pool(hidden, torch.ones_like(ids), "last")[0], pool(hidden, torch.ones_like(ids), "last")[1])


def test_cls_on_a_decoder_is_refused(tiny_llama_dir):
    with pytest.raises(ValueError, match="model.pooling=cls on a decoder-only model") as err:
        build_biencoder(BiEncoderConfig(name=str(tiny_llama_dir), pooling="cls", shared=True))
    assert "\n" not in str(err.value)
    build_biencoder(BiEncoderConfig(name=str(tiny_llama_dir), pooling="last", shared=True))


def test_cls_with_left_padding_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="model.pooling=cls with model.padding_side=left"):
        build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), pooling="cls", padding_side="left"))
    build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), pooling="cls"))


def test_dpr_train_refuses_it_in_one_line_before_any_step(tiny_llama_dir, tiny_data_dir, tmp_path):
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    out = tmp_path / "run"
    proc = run_command(["dpr-train", "--config-dir", str(conf), "data=tiny", f"data_dir={tiny_data_dir}",
                        f"output_dir={out}", "model=tiny", f"model.name={tiny_llama_dir}", "model.pooling=cls",
                        "train.max_steps=2"], cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("dpr-train")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "model.pooling=cls on a decoder-only model" in lines[0]
    assert not (out / "checkpoints").exists() and not (out / "train_summary.json").exists()


def test_a_collapsed_model_is_not_called_done(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """Training whose vectors end in one point is refused before its summary is written (here the pooling is made
    to return one vector for every text, as cls on a decoder did)."""
    from dpr.models import pooling
    from dpr.training.train import train
    from tests.training.test_resume import tiny_cfg

    cfg = tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "run", precision="fp32", max_steps=1, save_every=0)
    real = pooling._POOLERS["mean"]
    monkeypatch.setitem(pooling._POOLERS, "mean", lambda h, m: real(h, m)[:1].expand(h.shape[0], -1))
    with pytest.raises(ValueError, match=r"gives 1 distinct vectors for \d+ different training passages"):
        train(cfg)
    assert not (tmp_path / "run" / "train_summary.json").exists()
    monkeypatch.setitem(pooling._POOLERS, "mean", real)
    assert train(cfg)["steps"] == 1
