"""Shards and indexes carry fingerprints of their passages file and model: no silently wrong index."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.encode_kw import encode_corpus  # the keyword form: settings split into EncodeConfig
from dpr.errors import DataError
from dpr.index import build_and_save, build_index
from dpr.index.fingerprint import check_index_matches, model_fingerprint, passages_fingerprint
from dpr.index.shards import list_shards, write_shard
from tests.run_command import run_as_subprocess

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def other_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny BERT with other random weights: same dimension, another model."""
    import torch
    from transformers import BertModel

    out = tmp_path_factory.mktemp("other_bert")
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    torch.manual_seed(1)
    BertModel(BertModel.from_pretrained(tiny_model_dir).config).save_pretrained(out)
    return out


def _encode(model, passages, out, shard_id, num_shards=2):
    return encode_corpus(model, passages, out, shard_id=shard_id, num_shards=num_shards, batch_size=4,
                         dtype="float32", progress=False)


def _error(fn, *args) -> str:
    with pytest.raises(DataError) as info:
        fn(*args)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_fingerprints_follow_content_not_names(tiny_model_dir, tiny_data_dir, tmp_path):
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    copy = tmp_path / "copy.tsv"
    shutil.copy(passages, copy)
    assert passages_fingerprint(copy) == passages_fingerprint(passages)
    copy.write_text(passages.read_text().replace("Berlin is", "Bonn is"))
    assert passages_fingerprint(copy) != passages_fingerprint(passages)
    model_copy = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_copy)
    assert model_fingerprint(model_copy) == model_fingerprint(tiny_model_dir)


def test_shards_from_two_passages_versions_refused(tiny_model_dir, tiny_data_dir, tmp_path):
    """Shard 0 encoded from passages v1, shard 1 from v2 (one passage removed): before, the index lost a
    passage silently; now dpr-index refuses, naming the shard and the field."""
    passages = tmp_path / "passages.tsv"
    shutil.copy(tiny_data_dir / "tiny" / "passages.tsv", passages)
    emb = tmp_path / "emb"
    _encode(tiny_model_dir, passages, emb, 0)
    lines = passages.read_text().splitlines(keepends=True)
    passages.write_text("".join(lines[:2] + lines[3:]))  # v2: p2 deleted
    _encode(tiny_model_dir, passages, emb, 1)
    msg = _error(list_shards, emb)
    assert "shard_001_of_002.json" in msg and "passages_sha256" in msg


def test_shards_from_retrained_model_refused(tiny_model_dir, other_model_dir, tiny_data_dir, tmp_path):
    """A model retrained into the same run dir between two shards: refused (field model_fingerprint)."""
    run = tmp_path / "run"
    shutil.copytree(tiny_model_dir, run)
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    emb = tmp_path / "emb"
    _encode(run, passages, emb, 0)
    shutil.copytree(other_model_dir, run, dirs_exist_ok=True)  # "retrained" in place
    _encode(run, passages, emb, 1)
    msg = _error(list_shards, emb)
    assert "shard_001_of_002.json" in msg and "model_fingerprint" in msg


def _ranged(root: Path, ranges: list[tuple[int, int]], total: int = 10, dim: int = 4) -> Path:
    x = np.random.default_rng(0).standard_normal((total, dim)).astype(np.float32)
    for i, (a, b) in enumerate(ranges):
        write_shard(root, i, len(ranges), x[a:b], [f"d{j}" for j in range(a, b)], start=a, end=b, total=total)
    return root


@pytest.mark.parametrize("ranges, field, words", [
    ([(0, 4), (5, 10)], "start", "gap: passages [4, 5)"),
    ([(0, 6), (5, 10)], "start", "overlap: passages [5, 6)"),
    ([(0, 5), (5, 9)], "end", "cover [0, 9) of 10"),
])
def test_shard_ranges_must_cover_the_corpus_exactly(tmp_path, ranges, field, words):
    msg = _error(list_shards, _ranged(tmp_path / "emb", ranges))
    assert f"field '{field}'" in msg and words in msg and "shard_001_of_002.json" in msg


def test_exact_cover_accepted(tmp_path):
    assert sum(s.count for s in list_shards(_ranged(tmp_path / "emb", [(0, 5), (5, 10)]))) == 10


@pytest.mark.parametrize("factory", ["Flat", "IVF2,Flat"])
def test_non_finite_vectors_refused_with_shard_and_row(tmp_path, factory):
    x = np.random.default_rng(0).standard_normal((200, 8)).astype(np.float32)
    x[137, 3] = np.nan
    write_shard(tmp_path / "emb", 0, 2, x[:100], [f"d{j}" for j in range(100)])
    write_shard(tmp_path / "emb", 1, 2, x[100:], [f"d{j}" for j in range(100, 200)])
    msg = _error(lambda: build_index(tmp_path / "emb", factory=factory, metric="ip"))
    assert "shard_001_of_002.npy:row 37:" in msg and "'d137'" in msg


def _index(model, passages, tmp_path) -> Path:
    emb = tmp_path / "emb"
    encode_corpus(model, passages, emb, batch_size=4, dtype="float32", progress=False)
    build_and_save(emb, tmp_path / "index.faiss", factory="Flat", metric="ip")
    return tmp_path / "index.faiss"


def test_index_meta_carries_fingerprints_and_check_passes(tiny_model_dir, tiny_data_dir, tmp_path):
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    index = _index(tiny_model_dir, passages, tmp_path)
    meta = json.loads(Path(str(index) + ".json").read_text())
    assert meta["model_fingerprint"] == model_fingerprint(tiny_model_dir)
    assert meta["passages_sha256"] == passages_fingerprint(passages)
    assert check_index_matches(index, tiny_model_dir, passages)["count"] == 8


def test_retrieve_refuses_index_of_another_model_or_corpus_before_encoding(
        tiny_model_dir, other_model_dir, tiny_data_dir, tmp_path):
    """Before: the other model (same dim) searched the index without a word. The check runs before any
    question is read or encoded: the questions file here does not even exist."""
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    index = _index(tiny_model_dir, passages, tmp_path)
    msg = _error(check_index_matches, index, other_model_dir, passages)
    assert "model_fingerprint" in msg and str(other_model_dir) in msg
    edited = tmp_path / "edited.tsv"
    edited.write_text(passages.read_text().replace("Berlin is", "Bonn is"))
    assert "passages_sha256" in _error(check_index_matches, index, tiny_model_dir, edited)

    for model, psg, field in ((other_model_dir, passages, "model_fingerprint"),
                              (tiny_model_dir, edited, "passages_sha256")):
        proc = run_as_subprocess(
            [str(BIN / "dpr-retrieve"), f"model={model}", f"index={index}", f"passages={psg}",
             f"qa={tmp_path / 'no_such_questions.tsv'}", f"output={tmp_path / 'out.json'}"],
            capture_output=True, text=True, timeout=300)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and field in lines[0], proc.stderr[-2000:]
        assert not (tmp_path / "out.json").exists()


def test_index_without_fingerprints_still_checked_for_dimension(tiny_model_dir, tmp_path):
    """An index built from shards that carry no fingerprints: its dimension is still checked against the
    model's (from the model's JSON files) before any question is encoded."""
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    write_shard(tmp_path / "emb", 0, 1, x, [f"d{i}" for i in range(5)])
    build_and_save(tmp_path / "emb", tmp_path / "i.faiss", factory="Flat", metric="ip")
    msg = _error(check_index_matches, tmp_path / "i.faiss", tiny_model_dir, None)
    assert "field 'dim'" in msg and "32-dim" in msg and "16-dim" in msg

