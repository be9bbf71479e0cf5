"""Pooling and tokenisation for any backbone: last-token pooling under either padding side, EOS appended exactly
once, decoders padded on the left with positions counted over real tokens, and the weights' dtype."""

from __future__ import annotations

import pytest
import torch

from dpr.models import BiEncoderConfig, build_biencoder, encode_texts, last_token_pool
from dpr.models.backbone import position_ids
from dpr.models.inference import tokenize_batch

pytestmark = pytest.mark.usefixtures("one_thread")
TEXTS = ["a short one", "a much longer question about the capital city of france and its rivers", "mid length text"]


def test_last_token_pool_finds_the_last_real_token_on_either_side():
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert last_token_pool(hidden, right)[:, 0].tolist() == [1.0, 7.0]
    assert last_token_pool(hidden, left)[:, 0].tolist() == [3.0, 7.0]
    assert position_ids(left).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_last_token_vectors_are_the_same_under_left_and_right_padding(family, tiny_llama_dir, tiny_qwen2_dir):
    path = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}[family]
    model, tok = build_biencoder(BiEncoderConfig(name=str(path), pooling="last", shared=True))
    assert model.decoder and tok.padding_side == "left"  # auto: decoders pad on the left
    alone = torch.cat([encode_texts(model, tok, [t], "question", autocast="off") for t in TEXTS])
    left = encode_texts(model, tok, TEXTS, "question", autocast="off", length_sort="none")
    tok.padding_side = "right"
    right = encode_texts(model, tok, TEXTS, "question", autocast="off", length_sort="none")
    batch = tokenize_batch(tok, TEXTS, None, 64)
    assert (batch["attention_mask"] == 0).any()  # the batch was padded, so the sides differ
    # fp32, tolerance 1e-5: attention over a different number of masked positions rounds differently
    torch.testing.assert_close(left, alone, rtol=0, atol=1e-5)
    torch.testing.assert_close(right, alone, rtol=0, atol=1e-5)


def test_eos_pooling_appends_exactly_one_eos(tiny_llama_dir):
    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_llama_dir), pooling="eos", shared=True,
                                                 question_max_length=8))
    eos = tok.eos_token_id
    long_text = "one two three four five six seven eight nine ten eleven twelve"
    batch = tokenize_batch(tok, ["hi", long_text], None, 8)
    for ids, mask in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist()):
        real = [i for i, m in zip(ids, mask) if m]
        assert real[-1] == eos and real.count(eos) == 1
    assert int(batch["attention_mask"][1].sum()) == 8  # cut one short of max_length, then EOS: within it
    assert batch["attention_mask"][0, 0] == 0  # left padding
    # pairs (title, text) end in one EOS too
    pair = tokenize_batch(tok, ["text"], ["title"], 16)
    assert pair["input_ids"][0].tolist().count(tok.eos_token_id) == 1
    # a tokenizer that already ends every input with the EOS token gets no second one
    tok.tokenizer.eos_token = tok.tokenizer.sep_token
    again = tok(["hi there"], truncation=True, max_length=8)
    assert again["input_ids"][0].count(tok.tokenizer.sep_token_id) == 1


def test_encoders_are_tokenised_and_called_as_before(tiny_model_dir):
    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), pooling="cls"))
    assert not model.decoder and type(tok).__name__ != "EosTokenizer" and tok.padding_side == "right"


def test_bf16_weights_key(tiny_llama_dir):
    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_llama_dir), pooling="last", shared=True, dtype="bf16",
                                                 gradient_checkpointing=True))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.question_encoder.is_gradient_checkpointing
    vec = encode_texts(model, tok, TEXTS, "question", autocast="off")
    assert vec.dtype == torch.float32 and torch.isfinite(vec).all()
    with pytest.raises(ValueError, match="model.dtype"):
        BiEncoderConfig(dtype="fp16")
