"""BiEncoder: pooling, towers, similarity, save/load round trips and inference encoding."""

from __future__ import annotations

import json
import os

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from dpr.errors import DataError
from dpr.models import (
    BiEncoder,
    BiEncoderConfig,
    build_biencoder,
    detect_pooling,
    encode_texts,
    is_biencoder_dir,
    iter_encode_batches,
    load_biencoder,
    load_weights,
    save_biencoder,
    save_weights,
)
from dpr.models.hub import default_model_path
from dpr.models.pooling import cls_pool, mean_pool, pool

TEXTS = [
    "Honolulu is the capital of Hawaii.",
    "short",
    "Paris is the capital and most populous city of France, on the Seine.",
    "Berlin",
    "Water boils at 100 degrees Celsius at sea level, less on mountains.",
]
TITLES = ["Honolulu", "", "Paris", "Berlin", "Water"]


def tiny(tiny_model_dir, **kw) -> tuple[BiEncoder, object]:
    torch.manual_seed(0)
    return build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), **kw))


# --- pooling -----------------------------------------------------------------------------------


def test_pooling_by_hand():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])  # 3rd token is padding
    mask = torch.tensor([[1, 1, 0]])
    assert mean_pool(hidden, mask).tolist() == [[2.0, 3.0]]
    assert cls_pool(hidden, mask).tolist() == [[1.0, 2.0]]
    assert pool(hidden, mask, "mean").tolist() == [[2.0, 3.0]]
    with pytest.raises(ValueError):
        pool(hidden, mask, "max")


def test_detect_pooling(tiny_model_dir, tmp_path):
    assert detect_pooling(default_model_path()) == "mean"  # sentence-transformers MiniLM
    assert detect_pooling(tiny_model_dir) is None  # plain HF model
    assert detect_pooling("bert-base-uncased") is None  # not a local dir
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    assert detect_pooling(tmp_path) == "cls"


# --- config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw", [{"pooling": "max"}, {"similarity": "l2"}, {"temperature": 0}, {"projection_dim": 0}, {"passage_max_length": 0}]
)
def test_config_rejects_bad_values(kw):
    with pytest.raises(ValueError):
        BiEncoderConfig(**kw)


def test_config_from_dict_rejects_unknown_keys():
    assert BiEncoderConfig.from_dict({"pooling": "cls"}).pooling == "cls"
    with pytest.raises(ValueError, match="poolin"):
        BiEncoderConfig.from_dict({"poolin": "cls"})


# --- towers and similarity ---------------------------------------------------------------------


def _batch(tok, texts):
    return dict(tok(texts, padding="longest", return_tensors="pt"))


def test_shared_towers_share_parameters(tiny_model_dir):
    model, tok = tiny(tiny_model_dir, shared=True, projection_dim=8)
    assert model.passage_encoder is model.question_encoder
    assert model.passage_projection is model.question_projection
    assert not any(k.startswith("passage") for k in model.state_dict())
    # A passage-side loss moves the (one) encoder's weights.
    _, p = model(None, _batch(tok, TEXTS[:2]))
    p.sum().backward()
    assert model.question_encoder.embeddings.word_embeddings.weight.grad is not None
    assert model.question_projection.weight.grad is not None
    # Same inputs -> same vectors from both towers.
    b = _batch(tok, TEXTS[:2])
    assert torch.equal(model.encode_questions(**b), model.encode_passages(**b))


def test_separate_towers_are_independent_copies(tiny_model_dir):
    model, tok = tiny(tiny_model_dir)
    assert model.passage_encoder is not model.question_encoder
    qw = model.question_encoder.embeddings.word_embeddings.weight
    pw = model.passage_encoder.embeddings.word_embeddings.weight
    assert torch.equal(qw, pw) and qw.data_ptr() != pw.data_ptr()
    with torch.no_grad():
        pw.add_(1.0)
    assert not torch.equal(qw, pw)
    # The unused HF pooler is frozen (DDP would flag parameters without gradients).
    assert all(not p.requires_grad for n, p in model.named_parameters() if ".pooler." in n)
    assert all(p.requires_grad for n, p in model.named_parameters() if ".pooler." not in n)


def test_cosine_returns_unit_vectors_and_scaled_dot(tiny_model_dir):
    model, tok = tiny(tiny_model_dir, similarity="cosine", temperature=0.05, projection_dim=16)
    b = _batch(tok, TEXTS)
    q, p = model(b, b)
    assert q.shape == (5, 16) and q.dtype == torch.float32
    assert torch.allclose(q.norm(dim=-1), torch.ones(5), atol=1e-5)
    assert torch.allclose(model.similarity(q, p), (q @ p.T) / 0.05, atol=1e-4)
    # Unnormalised input vectors are normalised by similarity() too.
    assert torch.allclose(model.similarity(3 * q, p), model.similarity(q, p), atol=1e-4)


def test_dot_similarity_is_raw(tiny_model_dir):
    model, tok = tiny(tiny_model_dir, pooling="mean", temperature=2.0)
    q = torch.tensor([[1.0, 2.0]])
    p = torch.tensor([[3.0, 4.0], [0.0, 1.0]])
    assert model.similarity(q, p).tolist() == [[5.5, 1.0]]


# --- save / load -------------------------------------------------------------------------------


@pytest.mark.parametrize("shared", [False, True])
def test_save_load_round_trip(tiny_model_dir, tmp_path, shared):
    model, tok = tiny(tiny_model_dir, shared=shared, projection_dim=8, similarity="cosine", temperature=0.1)
    with torch.no_grad():  # make the towers differ, so a swapped tower would be caught
        model.passage_encoder.embeddings.word_embeddings.weight.mul_(1.5)
    out = tmp_path / "run"
    save_biencoder(model, tok, out)
    assert is_biencoder_dir(out)
    for sub in ("question_encoder", "passage_encoder"):
        assert (out / sub / "model.safetensors").is_file()
        assert isinstance(AutoModel.from_pretrained(out / sub), torch.nn.Module)
        assert AutoTokenizer.from_pretrained(out / sub)("hello")["input_ids"] == tok("hello")["input_ids"]
    assert (out / "projection.safetensors").is_file()
    assert not [p for p in os.listdir(out) if p.startswith(".")]  # no temp leftovers

    loaded, tok2 = load_biencoder(str(out))
    assert loaded.config == model.config
    for tower in ("question", "passage"):
        a = encode_texts(model, tok, TEXTS, tower, autocast=None)
        b = encode_texts(loaded, tok2, TEXTS, tower, autocast=None)
        assert torch.equal(a, b)


def test_saved_tower_equals_plain_hf_forward(tiny_model_dir, tmp_path):
    """Without a projection, a plain AutoModel + CLS pooling reproduces the exported question vectors."""
    model, tok = tiny(tiny_model_dir, pooling="cls")
    save_biencoder(model, tok, tmp_path / "run")
    hf = AutoModel.from_pretrained(tmp_path / "run" / "question_encoder").eval()
    b = _batch(tok, TEXTS)
    with torch.no_grad():
        expected = hf(**b).last_hidden_state[:, 0]
    assert torch.allclose(encode_texts(model, tok, TEXTS, "question", autocast=None), expected, atol=1e-5)


def test_load_overrides(tiny_model_dir, tmp_path):
    model, tok = tiny(tiny_model_dir, pooling="mean")
    save_biencoder(model, tok, tmp_path / "run")
    loaded, _ = load_biencoder(
        str(tmp_path / "run"), passage_max_length=32, temperature=0.5, pooling="mean", projection_dim=None
    )
    assert loaded.config.passage_max_length == 32 and loaded.config.temperature == 0.5
    with pytest.raises(ValueError, match="pooling"):
        load_biencoder(str(tmp_path / "run"), pooling="cls")


def test_load_untrained_defaults(tiny_model_dir):
    model, _ = load_biencoder(str(tiny_model_dir))
    assert model.config.pooling == "cls" and model.config.similarity == "dot"  # plain HF model: DPR's CLS
    model, _ = load_biencoder("all-MiniLM-L6-v2")
    assert model.config.pooling == "mean" and model.dim == 384  # sentence-transformers mean pooling
    model, _ = load_biencoder(str(tiny_model_dir), pooling="mean", shared=True)
    assert model.config.pooling == "mean" and model.config.shared


def test_bad_biencoder_json_is_a_data_error(tiny_model_dir, tmp_path):
    model, tok = tiny(tiny_model_dir)
    out = save_biencoder(model, tok, tmp_path / "run")
    (out / "biencoder.json").write_text('{"format": "dpr.biencoder", "version": 1, "config": {"pooling": "avg"}}')
    with pytest.raises(DataError, match="biencoder.json.*config"):
        load_biencoder(str(out))
    (out / "biencoder.json").write_text("{not json")
    with pytest.raises(DataError, match="biencoder.json:1"):
        load_biencoder(str(out))


def test_interrupted_save_is_not_a_loadable_run(tiny_model_dir, tmp_path, monkeypatch):
    model, tok = tiny(tiny_model_dir)
    out = save_biencoder(model, tok, tmp_path / "run")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(tok, "save_pretrained", boom)
    with pytest.raises(OSError):
        save_biencoder(model, tok, out)
    assert not is_biencoder_dir(out)  # the marker goes first and is written last
    assert (out / "question_encoder" / "config.json").is_file()  # the old tower was not half-replaced
    assert not [p for p in os.listdir(out) if p.startswith(".")]


def test_weights_round_trip(tiny_model_dir, tmp_path):
    model, _ = tiny(tiny_model_dir, projection_dim=8)
    save_weights(model, tmp_path / "w.safetensors")
    other, _ = tiny(tiny_model_dir, projection_dim=8)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    load_weights(other, tmp_path / "w.safetensors")
    for (n, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), n
    wrong, _ = tiny(tiny_model_dir, projection_dim=4)
    with pytest.raises(DataError, match="w.safetensors"):
        load_weights(wrong, tmp_path / "w.safetensors")


# --- inference encoding ------------------------------------------------------------------------


def test_encode_texts_order_and_direct_forward(tiny_model_dir):
    model, tok = tiny(tiny_model_dir, pooling="mean")
    model.train()  # encode_texts must switch dropout off and then restore the mode
    vecs = encode_texts(model, tok, TEXTS, "passage", batch_size=2, autocast=None)
    assert model.training
    assert vecs.shape == (5, 32) and vecs.dtype == torch.float32 and vecs.device.type == "cpu"
    model.eval()
    with torch.no_grad():
        for i, text in enumerate(TEXTS):  # one at a time: no padding at all
            direct = model.encode_passages(**_batch(tok, [text]))[0]
            assert torch.allclose(vecs[i], direct, atol=1e-5), i
        q_direct = model.encode_questions(**_batch(tok, TEXTS))
    assert torch.allclose(encode_texts(model, tok, TEXTS, "question", batch_size=3, autocast=None), q_direct, atol=1e-5)


def test_encode_texts_titles_are_pairs(tiny_model_dir):
    model, tok = tiny(tiny_model_dir)
    vecs = encode_texts(model, tok, TEXTS, "passage", batch_size=5, titles=TITLES, autocast=None)
    with torch.no_grad():
        for i, (text, title) in enumerate(zip(TEXTS, TITLES)):
            enc = tok(title, text, return_tensors="pt") if title else tok(text, return_tensors="pt")
            assert torch.allclose(vecs[i], model.encode_passages(**dict(enc))[0], atol=1e-5), i


def test_iter_encode_batches_cover_every_text_once(tiny_model_dir):
    model, tok = tiny(tiny_model_dir)
    seen = []
    for idx, vecs in iter_encode_batches(model, tok, TEXTS, "question", batch_size=2, autocast=None):
        assert len(idx) == vecs.shape[0] <= 2
        seen.extend(idx)
    assert sorted(seen) == list(range(len(TEXTS)))
    assert torch.is_grad_enabled()  # inference mode never leaks out of the generator


def test_encode_texts_bf16_close_to_fp32(tiny_model_dir):
    model, tok = tiny(tiny_model_dir, similarity="cosine")
    fp32 = encode_texts(model, tok, TEXTS, "passage", autocast=None)
    bf16 = encode_texts(model, tok, TEXTS, "passage", autocast="bf16")
    assert bf16.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(fp32, bf16).min() > 0.99


def test_encode_texts_empty_input(tiny_model_dir):
    model, tok = tiny(tiny_model_dir, projection_dim=8)
    assert encode_texts(model, tok, [], "passage").shape == (0, 8)


def test_encode_texts_rejects_bad_arguments(tiny_model_dir):
    model, tok = tiny(tiny_model_dir)
    with pytest.raises(ValueError):
        encode_texts(model, tok, TEXTS, "document")
    with pytest.raises(ValueError):
        encode_texts(model, tok, TEXTS, "passage", titles=TITLES[:2])
    with pytest.raises(ValueError):
        encode_texts(model, tok, TEXTS, "passage", autocast="fp8")
