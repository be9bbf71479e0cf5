"""Batching by token count (``length_sort="tokens"``, the default of every encode): the same vectors as
sorting by characters or not sorting, fewer padded positions, and the pre-tokenized rows pad to exactly what
the per-batch tokenizer call gives."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from dpr.models import BiEncoderConfig, build_biencoder, encode_texts, iter_encode_batches
from dpr.models.hub import default_model_path
from dpr.models.inference import length_batches, pad_tokenized, tokenize_batch, tokenize_each

pytestmark = pytest.mark.usefixtures("one_thread")

# Characters and tokens disagree here: digits and rare words are many tokens per character, plain words few.
TEXTS = [
    "1 2 3 4 5 6 7 8 9 0 1 2",                            # 23 characters, 12 tokens
    "the cat sat on the mat and then it slept",          # 40 characters, 10 tokens
    "Zygomorphic pseudohermaphroditism",                 # 33 characters, many word pieces
    "a b",                                               # short by both counts
    "Water boils at 100 degrees Celsius at sea level.",
    "9 8 7 6 5",
]
TITLES = ["Numbers", "", "Botany", "Letters", "", "Countdown"]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(default_model_path())


def _model(tiny_model_dir):
    torch.manual_seed(0)
    return build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), pooling="mean"))


@pytest.mark.parametrize("titles", [None, TITLES])
def test_every_length_sort_gives_the_same_vectors_in_input_order(tiny_model_dir, titles):
    model, tok = _model(tiny_model_dir)
    got = {sort: encode_texts(model, tok, TEXTS, "passage", batch_size=2, autocast="off", titles=titles,
                              length_sort=sort) for sort in ("tokens", "chars", "none")}
    for sort in ("chars", "none"):
        assert torch.allclose(got["tokens"], got[sort], atol=1e-5), sort
    model.eval()
    with torch.no_grad():  # one text at a time: no padding at all
        for i, text in enumerate(TEXTS):
            one = tokenize_batch(tok, [text], [titles[i]] if titles else None, 64)
            assert torch.allclose(got["tokens"][i], model.encode_passages(**one)[0], atol=1e-5), i


# (characters, tokens with [CLS]/[SEP]): (15, 17), (20, 4), (26, 17), (3, 3). By characters the batches of 2
# are {26, 20} and {15, 3}, each padded to 17 tokens (68 positions); by tokens {17, 17} and {4, 3} (42).
MISJUDGED = ["1.2.3.4.5.6.7.8", "internationalization", "abcdefghijklmnopqrstuvwxyz", "dog"]


def test_token_batches_are_longest_first_and_pad_less_than_char_batches(tiny_model_dir, tok):
    model, _ = _model(tiny_model_dir)
    lengths = [len(r["input_ids"]) for r in tokenize_each(tok, MISJUDGED, None, 64)]
    assert lengths == [17, 4, 17, 3]
    padded = {}
    for sort in ("tokens", "chars"):
        batches = [idx for idx, _ in iter_encode_batches(model, tok, MISJUDGED, "passage", batch_size=2,
                                                         autocast="off", length_sort=sort)]
        assert sorted(i for idx in batches for i in idx) == [0, 1, 2, 3]
        padded[sort] = sum(max(lengths[i] for i in idx) * len(idx) for idx in batches)
    assert padded == {"tokens": 42, "chars": 68}
    order = [i for idx in length_batches(lengths, 2) for i in idx]
    assert order == [0, 2, 1, 3]  # longest first, equal lengths in input order


def test_token_sorting_goes_chunk_by_chunk(tiny_model_dir, monkeypatch):
    """Texts are tokenized ahead a chunk at a time (memory stays flat on a whole corpus), each text once."""
    import dpr.models.inference as inference

    model, tok = _model(tiny_model_dir)
    whole = encode_texts(model, tok, TEXTS, "passage", batch_size=2, autocast="off", titles=TITLES)
    monkeypatch.setattr(inference, "TOKENIZE_CHUNK", 4)
    batches = list(iter_encode_batches(model, tok, TEXTS, "passage", batch_size=3, autocast="off", titles=TITLES))
    assert [len(idx) for idx, _ in batches] == [3, 1, 2]  # chunks [0, 4) and [4, 6), each cut into batches of 3
    assert sorted(i for idx, _ in batches for i in idx) == list(range(len(TEXTS)))
    chunked = encode_texts(model, tok, TEXTS, "passage", batch_size=2, autocast="off", titles=TITLES)
    assert torch.allclose(whole, chunked, atol=1e-5)


def test_a_bad_length_sort_is_refused(tiny_model_dir, tmp_path):
    from tests.encode_kw import encode_corpus  # the keyword form: settings split into EncodeConfig

    model, tok = _model(tiny_model_dir)
    with pytest.raises(ValueError, match="length_sort must be one of"):
        encode_texts(model, tok, TEXTS, "passage", length_sort="words")
    with pytest.raises(ValueError, match="length_sort must be one of"):
        encode_corpus(tmp_path / "no-model", tmp_path / "no.tsv", tmp_path / "out", length_sort="words")
    assert not (tmp_path / "out").exists()  # refused before any work


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_pre_tokenized_rows_pad_to_the_batch_tokenizer_call(tok, data):
    words = st.sampled_from(["paris", "1999", "the", "Zygomorphic", "é", "ocean", "42", "-", "capital"])
    text = st.lists(words, min_size=1, max_size=30).map(" ".join)
    texts = data.draw(st.lists(text, min_size=1, max_size=6))
    titles = data.draw(st.none() | st.lists(st.sampled_from(["", "Paris", "The Ocean 42"]),
                                            min_size=len(texts), max_size=len(texts)))
    prefix = data.draw(st.sampled_from(["", "passage: "]))
    max_length = data.draw(st.integers(4, 40))
    rows = tokenize_each(tok, texts, titles, max_length, prefix)
    subset = data.draw(st.lists(st.integers(0, len(texts) - 1), min_size=1, max_size=len(texts), unique=True))
    want = tokenize_batch(tok, [texts[i] for i in subset], [titles[i] for i in subset] if titles else None,
                          max_length, prefix)
    got = pad_tokenized(tok, [rows[i] for i in subset])
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
