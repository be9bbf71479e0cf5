"""Tokenise once (dpr/models/token_cache.py): the cached rows pad to exactly the tokenizer's batches, and the cache
is reused only while the data file and the tokenizer are the ones it was made from."""

from __future__ import annotations

import json
import os
import random

import pytest
import torch
from transformers import AutoTokenizer

from dpr.models.inference import tokenize_batch
from dpr.models.token_cache import (StaleTokenCache, build_table, cache_path, cached_table, load_table, table_params,
                                    text_key, tokenizer_fingerprint)
from dpr.stages import fingerprint

TEXTS = ["Honolulu is the capital of Hawaii.", "Paris is the capital and most populous city of France, " * 6,
         "short", "The mitochondria is the powerhouse of the cell.", "Berlin.", "Water boils at 100 degrees."]
TITLES = ["Honolulu", "Paris", "", "Mitochondrion", "Berlin", ""]


@pytest.fixture
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("titled", [True, False])
def test_padded_rows_equal_the_tokenizers_batches(tok, left, titled):
    tok.padding_side = "left" if left else "right"
    titles = TITLES if titled else None
    table = build_table(tok, TEXTS, titles, max_length=16, prefix="p: ")
    rng = random.Random(0)
    for _ in range(20):
        pick = rng.sample(range(len(TEXTS)), rng.randint(1, len(TEXTS)))
        texts = [TEXTS[i] for i in pick]
        sub_titles = [TITLES[i] for i in pick] if titled else None
        want = tokenize_batch(tok, texts, sub_titles, 16, prefix="p: ")
        got = table.pad(table.rows(texts, sub_titles))
        assert list(got) == list(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    assert table.rows(["not in the table"]) is None and table.row(TEXTS[0], TITLES[0] if titled else None) == 0


def _write(path, texts):
    path.write_text(json.dumps(texts), encoding="utf-8")


def test_cache_is_reused_when_up_to_date_and_refused_when_the_data_or_tokenizer_changed(tok, tmp_path, monkeypatch):
    data = tmp_path / "train.json"
    _write(data, TEXTS)
    first, reused = cached_table(data, "passages", tok, TEXTS, TITLES, max_length=16)
    assert not reused
    [made] = list((tmp_path / "token_cache").iterdir())
    assert (made / "manifest.json").is_file()

    # up to date: read back, equal, and the tokenizer is not called
    calls = []
    monkeypatch.setattr("dpr.models.tokenization._tokenize_rows", lambda *a, **k: calls.append(a) or [])
    again, reused = cached_table(data, "passages", tok, TEXTS, TITLES, max_length=16)
    assert reused and not calls and (again.keys == first.keys).all()
    assert torch.equal(again.pad(range(len(again)))["input_ids"], first.pad(range(len(first)))["input_ids"])
    monkeypatch.undo()

    # the tokenizer changed (a token added): that cache is refused for it, and a table is built for it
    other = AutoTokenizer.from_pretrained(tok.name_or_path)
    other.add_tokens(["honolulu-city"])
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(tok)
    keys = [text_key(t, ti) for t, ti in zip(TEXTS, TITLES)]
    want_other = fingerprint(table_params(other, keys, 16, "", True), [data])
    with pytest.raises(StaleTokenCache):
        load_table(made, want_other)
    _, reused = cached_table(data, "passages", other, TEXTS, TITLES, max_length=16)
    assert not reused

    # the data file changed (new content, new mtime): its old cache is refused and rebuilt from the new texts
    texts = TEXTS[:-1] + ["Water boils at 90 degrees on a mountain."]
    _write(data, texts)
    os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns + 10**9))
    params = table_params(tok, keys, 16, "", True)
    with pytest.raises(StaleTokenCache):
        load_table(cache_path(data, "passages", params), fingerprint(params, [data]))  # same texts, file changed
    rebuilt, reused = cached_table(data, "passages", tok, TEXTS, TITLES, max_length=16)
    assert not reused and (rebuilt.keys == first.keys).all()
    assert cached_table(data, "passages", tok, TEXTS, TITLES, max_length=16)[1]  # and reused from now on
    fresh, reused = cached_table(data, "passages", tok, texts, TITLES, max_length=16)
    assert not reused and fresh.row(texts[-1], TITLES[-1]) is not None


def test_a_damaged_cache_is_rebuilt_not_trusted(tok, tmp_path):
    data = tmp_path / "train.json"
    _write(data, TEXTS)
    cached_table(data, "questions", tok, TEXTS, None, max_length=16)
    [made] = list((tmp_path / "token_cache").iterdir())
    (made / "ids.npy").write_bytes(b"garbage")
    table, reused = cached_table(data, "questions", tok, TEXTS, None, max_length=16)
    want = tokenize_batch(tok, TEXTS[:1], None, 16)["input_ids"]
    assert not reused and torch.equal(table.pad([0])["input_ids"], want)


def test_encode_from_the_token_table_equals_encode_from_text(tiny_model_dir, monkeypatch):
    from dpr.models import encode_texts, load_biencoder

    model, tok = load_biencoder(str(tiny_model_dir), passage_max_length=16, passage_prefix="p: ")
    table = build_table(tok, TEXTS, TITLES, max_length=16, prefix="p: ")
    want = encode_texts(model, tok, TEXTS, "passage", batch_size=4, titles=TITLES, autocast="off")
    monkeypatch.setattr("dpr.models.tokenization._tokenize_rows", lambda *a, **k: pytest.fail("tokenized"))
    got = encode_texts(model, None, TEXTS, "passage", batch_size=4, titles=TITLES, autocast="off", tokens=table)
    assert torch.equal(got, want)


def test_the_cache_keeps_digests_of_the_texts_never_the_texts(tok, tmp_path):
    """A corpus's table on disk is its token ids and 16 bytes a text: no second copy of the corpus."""
    import numpy as np

    data = tmp_path / "passages.tsv"
    long_texts = [f"passage {i} " + "word " * 400 for i in range(30)]
    data.write_text("\n".join(long_texts), encoding="utf-8")
    table, _ = cached_table(data, "corpus", tok, long_texts, None, max_length=16)
    [made] = list((tmp_path / "token_cache").iterdir())
    assert not (made / "keys.json").exists()
    keys = np.load(made / "keys.npy")
    assert keys.dtype == np.dtype("S16") and len(keys) == 30 and (made / "keys.npy").stat().st_size < 30 * 16 + 256
    on_disk = b"".join(p.read_bytes() for p in made.iterdir())
    assert b"word word" not in on_disk
    again, reused = cached_table(data, "corpus", tok, long_texts, None, max_length=16)
    assert reused and again.rows(long_texts[::-1]) == list(range(29, -1, -1))
    assert again.rows(["passage 0 " + "word " * 399]) is None  # a text differing by one word is not found
