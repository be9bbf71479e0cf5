"""Dense retrieval and the hybrid take their settings whole (`RetrieveConfig`, what ``dpr-retrieve`` composes at its
root): the same results as the settings given as keywords, keywords overriding the object, and an unknown setting
refused in one line naming it."""

from __future__ import annotations

import json

import pytest

from dpr.retrieval.config import RetrieveConfig
from dpr.retrieval.retriever import DENSE_OPTIONS, dense_config
from dpr.retrieval.runs import dense_retrieve, hybrid_retrieve
from tests.retrieval.test_hybrid_config import runs  # noqa: F401 - the fixture


def test_dense_options_override_the_config():
    cfg = RetrieveConfig(batch_size=8, nprobe=4, k=5)
    got = dense_config(cfg, {"nprobe": 9, "autocast": "off"})
    assert (got.batch_size, got.nprobe, got.autocast, got.k) == (8, 9, "off", 5)
    assert dense_config(None, {}) == RetrieveConfig()
    assert set(DENSE_OPTIONS) < {f for f in RetrieveConfig.__dataclass_fields__}
    with pytest.raises(TypeError, match=r"unknown setting\(s\) 'k', 'nprob'; the known ones are batch_size"):
        dense_config(cfg, {"nprob": 1, "k": 3})


@pytest.fixture(scope="module")
def built(tiny_model_dir, tmp_path_factory):
    """The tiny passages encoded and indexed in-process, once for the module."""
    from dpr.encode import encode_corpus
    from dpr.encode_config import EncodeConfig
    from dpr.index import build_and_save
    from tests.conftest import write_tiny_dataset

    root = tmp_path_factory.mktemp("retrieve_config")
    data = write_tiny_dataset(root / "data" / "tiny")
    encode_corpus(tiny_model_dir, data / "passages.tsv", root / "emb", EncodeConfig(dtype="float32", autocast="off",
                  device="cpu"), progress=False)
    build_and_save(root / "emb", root / "index.faiss", factory="Flat")
    return root, data / "passages.tsv", data / "test.qa.tsv"


def test_dense_retrieve_config_equals_keywords(built, tiny_model_dir, tmp_path):
    root, psg, qa = built
    cfg = RetrieveConfig(k=3, batch_size=4, autocast="off", device="cpu", match="regex")
    by_object = dense_retrieve(tiny_model_dir, root / "index.faiss", psg, qa, tmp_path / "a.json", cfg)
    by_keywords = dense_retrieve(tiny_model_dir, root / "index.faiss", psg, qa, tmp_path / "b.json", k=3,
                                 batch_size=4, autocast="off", device="cpu", match="regex")
    assert by_object == by_keywords and all(len(r["ctxs"]) == 3 for r in by_object)
    overridden = dense_retrieve(tiny_model_dir, root / "index.faiss", psg, qa, None, cfg, k=2)
    assert all(len(r["ctxs"]) == 2 for r in overridden)
    with pytest.raises(TypeError, match="dense_retrieve\\(\\) got unknown setting\\(s\\) 'kk'"):
        dense_retrieve(tiny_model_dir, root / "index.faiss", psg, qa, None, cfg, kk=2)


def test_hybrid_takes_the_retrieve_config_whole(runs, tmp_path):  # noqa: F811 - the fixture
    bm25, dense = runs
    by_object = hybrid_retrieve(bm25, dense, tmp_path / "a.json", config=RetrieveConfig(weight=0.5, k=2))
    by_keywords = hybrid_retrieve(bm25, dense, tmp_path / "b.json", weight=0.5, k=2)
    assert {**by_object, "output": ""} == {**by_keywords, "output": ""}
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    assert all(len(r["ctxs"]) <= 2 for r in json.loads((tmp_path / "a.json").read_text()))
    info = hybrid_retrieve(bm25, dense, tmp_path / "c.json", config=RetrieveConfig(weight=0.5), fusion="rrf", k_rrf=5.0)
    assert info["fusion"] == "rrf" and info["k_rrf"] == 5.0
    with pytest.raises(TypeError, match="hybrid_retrieve\\(\\) got unknown setting\\(s\\) 'wieght'; the known ones"):
        hybrid_retrieve(bm25, dense, tmp_path / "d.json", weight=0.5, wieght=1.0)
