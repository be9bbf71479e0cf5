"""`build_index` takes its settings whole (`BuildOptions`, the ``index`` section of dpr-index and dpr-pipeline): the
same index as the same settings given as keywords, keywords overriding the object, any other key refused, and every
setting checked before any shard is read."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpr.index import search
from dpr.index.build import BuildOptions, build_index
from tests.index.test_index import make_vectors, write_embeddings


@pytest.fixture(scope="module")
def emb(tmp_path_factory):
    root = tmp_path_factory.mktemp("emb")
    return root, write_embeddings(root, make_vectors(900, 16), num_shards=2)


def test_options_object_equals_keywords(emb):
    root, ids = emb
    settings = dict(factory="IVF{nlist},Flat", train_sample=500, nprobe=3, seed=7, add_batch_size=128)
    by_object, ids_a = build_index(root, BuildOptions(**settings))
    by_keywords, ids_b = build_index(root, **settings)
    assert ids_a == ids_b == ids
    queries = make_vectors(12, 16, seed=3)
    hits_a, scores_a = search(by_object, ids_a, queries, k=5)
    hits_b, scores_b = search(by_keywords, ids_b, queries, k=5)
    assert hits_a == hits_b
    np.testing.assert_array_equal(scores_a, scores_b)
    assert by_object.nprobe == by_keywords.nprobe == 3


def test_keywords_override_the_object_and_other_keys_are_refused(emb):
    root, _ = emb
    index, _ = build_index(root, BuildOptions(factory="HNSW8", ef_search=9), ef_search=21)
    assert index.hnsw.efSearch == 21
    assert BuildOptions.of(BuildOptions(metric="l2"), seed=3) == BuildOptions(metric="l2", seed=3)
    with pytest.raises(TypeError, match="build_index\\(\\) got unknown setting\\(s\\) 'index_kind'; the known "
                       "ones are factory, metric"):
        build_index(root, BuildOptions(factory="HNSW8"), index_kind="hnsw")
    with pytest.raises(dataclasses.FrozenInstanceError):
        BuildOptions().seed = 1  # type: ignore[misc]


@pytest.mark.parametrize("options, error, words", [
    (BuildOptions(metric="cos"), ValueError, "metric must be one of"),
    (BuildOptions(device="tpu"), ValueError, "device must be 'cpu' or 'gpu'"),
    (BuildOptions(nlist=0), ValueError, "index.nlist must be an integer"),
    (BuildOptions(seed=None), TypeError, "index.seed must be an integer"),
    (BuildOptions(add_batch_size=0), ValueError, "index.add_batch_size must be an integer"),
])
def test_each_setting_is_checked_before_the_shards_are_read(tmp_path, options, error, words):
    with pytest.raises(error, match=words):
        build_index(tmp_path / "no-embeddings", options)
