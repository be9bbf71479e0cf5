"""Corpus vectors handed into and out of training (dpr.training.corpus_reuse, dpr.encode.save_encoded)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.encode_kw import encode_corpus, save_encoded  # the keyword form: settings split into EncodeConfig
from dpr.index.shards import read_embeddings
from dpr.models import encode_texts, load_biencoder
from dpr.perf import cpu_supports_bf16
from dpr.training.corpus_negatives import CorpusNegatives
from dpr.training.corpus_reuse import check_start_vectors
from dpr.training.train import train
from dpr.training.validation import load_corpus
from dpr.trainkit.metrics_log import read_jsonl
from tests.training.test_trainer import tiny_cfg


# tiny models on a shared 2-core box: one intra-op thread (conftest.one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


def _corpus_vectors(model_dir, passages, **kw):
    model, tok = load_biencoder(str(model_dir), pooling="mean", **kw)
    ids, texts, titles = load_corpus(passages)
    return model, tok, (ids, texts, titles), encode_texts(model, tok, texts, tower="passage", titles=titles,
                                                         max_length=64, autocast="off")


def test_start_vectors_are_checked_against_the_starting_weights(tiny_model_dir, tiny_data_dir):
    model, tok, corpus, vecs = _corpus_vectors(tiny_model_dir, tiny_data_dir / "tiny" / "passages.tsv")
    kw = dict(max_length=64, autocast="off")
    ok = check_start_vectors(model, tok, corpus, (corpus[0], vecs.numpy().astype(np.float16)), **kw)
    assert torch.allclose(ok, vecs, atol=1e-3)
    with pytest.raises(ValueError, match="not the corpus's 8 passage ids in file order"):
        check_start_vectors(model, tok, corpus, (corpus[0][::-1], vecs), **kw)
    other = torch.nn.functional.normalize(vecs + 0.1 * torch.randn_like(vecs), dim=-1)
    with pytest.raises(ValueError, match="encoded by other weights"):
        check_start_vectors(model, tok, corpus, (corpus[0], other), source="emb/dir", **kw)


def test_training_from_given_start_vectors_equals_encoding_them(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    # fp32 pinned: the claim is that given vectors replace encoding exactly, and the vectors handed in are
    # computed in fp32 (``autocast="off"``); under bf16 the two paths would round differently by design
    kw = dict(max_steps=3, frozen_steps=3, validate_at_start=True, val_corpus_topk=True, precision="fp32")
    plain = train(tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "a", **kw))
    _, _, corpus, vecs = _corpus_vectors(tiny_model_dir, tiny_data_dir / "tiny" / "passages.tsv")

    def no_encoding(*a, **k):
        raise AssertionError("the corpus was encoded although its start vectors were given")

    monkeypatch.setattr(CorpusNegatives, "refresh", no_encoding)
    saved = []
    reused = train(tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "b", **kw), start_vectors=(corpus[0], vecs),
                   on_saved=lambda *a, **k: saved.append((a, k)))
    assert reused["initial_validation"] == plain["initial_validation"]
    assert [r["loss"] for r in read_jsonl(tmp_path / "b" / "metrics.jsonl")] == \
        [r["loss"] for r in read_jsonl(tmp_path / "a" / "metrics.jsonl")]
    # the saved weights' corpus vectors come out: what encoding the saved model gives
    (model_dir, ids, out_vecs), extra = saved[0]
    assert model_dir == tmp_path / "b" and ids == corpus[0]
    assert extra["computed_with"]["max_length"] == 64 and extra["computed_with"]["autocast"] == "off"
    _, _, _, again = _corpus_vectors(tmp_path / "b", tiny_data_dir / "tiny" / "passages.tsv")
    assert torch.allclose(out_vecs, again, atol=1e-5)


def test_saved_vectors_make_encode_skip_and_read_back_as_encoded(tiny_model_dir, tiny_data_dir, tmp_path, caplog):
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=2))
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    _, _, corpus, vecs = _corpus_vectors(out, passages)
    # fp32 pinned on both sides (the vectors are computed with autocast "off", and encode_corpus is asked
    # for "off"): under ``auto`` the answer would depend on whether this CPU has bf16; the bf16 case of the
    # same contract is the next test
    with_ = {"device": "cpu", "autocast": "off", "max_length": 64}
    encode_kw = dict(autocast="off", runtime="torch")
    # refused: not what encode_corpus would compute
    assert not save_encoded(out, passages, tmp_path / "e0", corpus[0][::-1], vecs.numpy(), computed_with=with_,
                            autocast="off")
    assert not save_encoded(out, passages, tmp_path / "e0", corpus[0], vecs.numpy(), computed_with=with_,
                            autocast="off", runtime="onnx")
    assert not save_encoded(out, passages, tmp_path / "e0", corpus[0], vecs.numpy(),
                            computed_with={**with_, "max_length": 32}, autocast="off")
    assert not save_encoded(out, passages, tmp_path / "e0", corpus[0], vecs.numpy(), computed_with=with_,
                            autocast="bf16")  # fp32 vectors are not what a bf16 encode computes
    assert not (tmp_path / "e0").exists() or not any((tmp_path / "e0").iterdir())
    assert save_encoded(out, passages, tmp_path / "e1", corpus[0], vecs.numpy(), computed_with=with_, **encode_kw)
    caplog.set_level("INFO")
    encode_corpus(out, passages, tmp_path / "e1", progress=False, **encode_kw)
    assert "already encoded" in caplog.text
    ids, stored = read_embeddings(tmp_path / "e1")
    fresh_ids, fresh = read_embeddings(encode_corpus(out, passages, tmp_path / "e2", progress=False, **encode_kw))
    assert ids == fresh_ids and stored.dtype == np.float32
    np.testing.assert_allclose(stored, fresh, atol=1e-3)
    m1 = json.loads((tmp_path / "e1" / "shard_000_of_001.json").read_text())
    m2 = json.loads((tmp_path / "e2" / "shard_000_of_001.json").read_text())
    assert {k: v for k, v in m1.items() if k not in ("seconds", "passages_per_second", "reused_from")} == \
        {k: v for k, v in m2.items() if k not in ("seconds", "passages_per_second")}


@pytest.mark.precision
def test_vectors_training_saves_under_auto_are_what_encode_under_auto_computes(tiny_model_dir, tiny_data_dir,
                                                                               tmp_path, caplog):
    """The contract under ``auto`` on either precision rule (``pytest -m precision`` runs it under both): the
    vectors the trainer hands out are stored, the encode with default settings skips, and what it would
    have computed agrees (bf16 rounding where the rule is bf16)."""
    out, passages, saved = tmp_path / "run", tiny_data_dir / "tiny" / "passages.tsv", []
    train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=2, validate_at_start=True, val_corpus_topk=True),
          on_saved=lambda *a, **k: saved.append((a, k)))
    (model_dir, ids, vecs), extra = saved[-1]
    bf16 = cpu_supports_bf16()
    assert extra["computed_with"]["autocast"] == ("bf16" if bf16 else "off")
    assert save_encoded(out, passages, tmp_path / "e1", ids, vecs.numpy(), computed_with=extra["computed_with"],
                        runtime="torch")
    caplog.set_level("INFO")
    encode_corpus(out, passages, tmp_path / "e1", runtime="torch", progress=False)
    assert "already encoded" in caplog.text
    stored_ids, stored = read_embeddings(tmp_path / "e1")
    fresh_ids, fresh = read_embeddings(encode_corpus(out, passages, tmp_path / "e2", runtime="torch", progress=False))
    assert stored_ids == fresh_ids == ids
    np.testing.assert_allclose(stored, fresh, atol=3e-2 if bf16 else 1e-3)


@pytest.mark.precision  # compares numbers under auto: runs under both rules in .ci/run
def test_start_vectors_from_a_directory_of_other_weights_name_it(tiny_model_dir, tiny_data_dir, tmp_path):
    trained = tmp_path / "trained"
    train(tiny_cfg(tiny_model_dir, tiny_data_dir, trained, max_steps=4, lr=1e-2, validate=False))
    emb = encode_corpus(trained, tiny_data_dir / "tiny" / "passages.tsv", tmp_path / "emb", progress=False)
    with pytest.raises(ValueError, match=f"{emb}: the first 8 passages' vectors differ .* encoded by other weights"):
        train(tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "run", max_steps=1, frozen_steps=1,
                       validate_at_start=True), start_vectors=emb)
