"""LoRA through peft: only the adapters train, merged and unmerged adapters give the same vectors, a run directory
and its checkpoints hold the adapters (not a copy of the base), a killed LoRA run resumes to the same adapters."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from dpr.errors import DataError
from dpr.models import BiEncoderConfig, build_biencoder, encode_texts, load_biencoder, save_biencoder
from dpr.models.lora import merged_copy
from dpr.models.run_format import plain_tower_dirs

pytestmark = pytest.mark.usefixtures("one_thread")
LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
TEXTS = ["who wrote hamlet", "the capital of france is paris, on the seine", "water boils"]


def _randomise_adapters(model: torch.nn.Module) -> None:
    """peft starts lora_B at zero (the base's vectors): give the adapters weights so they change the vectors."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def _lora_model(path, **kw):
    torch.manual_seed(0)
    return build_biencoder(BiEncoderConfig(name=str(path), pooling="last", lora=LORA, **kw))


def test_only_adapter_parameters_receive_gradients(tiny_llama_dir):
    model, tok = _lora_model(tiny_llama_dir, projection_dim=8)
    model.train()
    q = tok(TEXTS, padding="longest", return_tensors="pt")
    qv, pv = model(q, q)
    model.similarity(qv, pv).logsumexp(-1).sum().backward()
    got = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert got and got == {n for n in trainable if "lora_B" in n or "projection" in n}  # B starts at 0: A's grad is 0
    assert all(".lora_" in n or "projection" in n for n in trainable)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert n_train < 0.05 * sum(p.numel() for p in model.parameters())


def test_merged_and_unmerged_adapters_give_the_same_vectors(tiny_llama_dir):
    model, tok = _lora_model(tiny_llama_dir, shared=True)
    _randomise_adapters(model)
    before = encode_texts(model, tok, TEXTS, "question", autocast="off")
    base_only = model.question_encoder
    model.question_encoder = merged_copy(base_only)
    assert not any("lora_" in n for n, _ in model.named_parameters())
    merged = encode_texts(model, tok, TEXTS, "question", autocast="off")
    # fp32; 1e-5: the merged weight W + BA rounds differently from W x + B(A x)
    torch.testing.assert_close(merged, before, rtol=0, atol=1e-5)
    model.question_encoder = base_only
    assert (encode_texts(model, tok, TEXTS, "question", autocast="off") - before).abs().max() < 1e-6


def test_a_lora_run_holds_adapters_and_the_base_name(tiny_llama_dir, tmp_path):
    model, tok = _lora_model(tiny_llama_dir)
    _randomise_adapters(model)
    save_biencoder(model, tok, tmp_path / "run")
    doc = json.loads((tmp_path / "run" / "biencoder.json").read_text())
    assert doc["config"]["name"] == str(tiny_llama_dir) and doc["config"]["lora"]["r"] == 4
    assert len(doc["base_fingerprint"]) == 64
    for tower in ("question_encoder", "passage_encoder"):
        files = {p.name for p in (tmp_path / "run" / tower).iterdir()}
        assert "adapter_model.safetensors" in files and "model.safetensors" not in files
    loaded, ltok = load_biencoder(tmp_path / "run")
    for tower in ("question", "passage"):
        torch.testing.assert_close(encode_texts(loaded, ltok, TEXTS, tower, autocast="off"),
                                   encode_texts(model, tok, TEXTS, tower, autocast="off"), rtol=0, atol=1e-6)
    # the checkpoints' weights (state_dict) are the adapters alone
    keys = set(loaded.state_dict())
    assert keys and all(".lora_" in k for k in keys)
    # the plain copies an export loads are the merged towers
    with plain_tower_dirs(tmp_path / "run", loaded) as towers:
        assert (towers["question"] / "model.safetensors").is_file()
        assert not any("lora" in k for k in load_file(str(towers["question"] / "model.safetensors")))


def test_adapters_on_another_base_are_refused(tiny_llama_dir, tmp_path):
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_llama_dir, base)
    model, tok = _lora_model(base)
    save_biencoder(model, tok, tmp_path / "run")
    weights = load_file(str(base / "model.safetensors"))
    from safetensors.torch import save_file

    save_file({k: v + 1 for k, v in weights.items()}, str(base / "model.safetensors"))
    with pytest.raises(DataError, match="base_fingerprint"):
        load_biencoder(tmp_path / "run")


def test_a_killed_lora_run_resumes_to_the_same_adapters(tiny_llama_dir, tiny_data_dir, tmp_path):
    from dpr.training.train import train
    from tests.training.test_resume import kill_after_first_checkpoint, tiny_cfg

    def cfg(out):
        c = tiny_cfg(tiny_llama_dir, tiny_data_dir, out, precision="fp32")
        c["model"].update(pooling="last", lora=LORA)
        return c

    full, crashed = tmp_path / "full", tmp_path / "crashed"
    train(cfg(full))
    killed_at = kill_after_first_checkpoint(cfg(crashed), crashed)
    summary = train(cfg(crashed))
    assert summary["resumed_from"].endswith(f"step_{killed_at}")
    a = load_file(str(full / "checkpoints" / "step_12" / "model.safetensors"))
    b = load_file(str(crashed / "checkpoints" / "step_12" / "model.safetensors"))
    assert a.keys() == b.keys() and all(".lora_" in k for k in a)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)
    for tower in ("question_encoder", "passage_encoder"):
        x = load_file(str(full / tower / "adapter_model.safetensors"))
        y = load_file(str(crashed / tower / "adapter_model.safetensors"))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
        assert not (full / tower / "model.safetensors").exists()
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in x.items() if "lora_B" in k)  # it trained
