"""One rule for the functions that take a settings object plus keyword settings overriding it (`DenseRetriever`,
`dense_retrieve`, `hybrid_retrieve`, `build_index` / `BuildOptions.of`): an unknown key is one TypeError naming the
key and the known ones (`dpr.config.with_overrides`), raised before any file is read."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpr.config import check_known_keys, with_overrides
from dpr.index.build import BuildOptions, build_index
from dpr.retrieval.config import RetrieveConfig
from dpr.retrieval.fusion import HybridConfig
from dpr.retrieval.retriever import DENSE_OPTIONS, DenseRetriever
from dpr.retrieval.runs import dense_retrieve, hybrid_retrieve


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


# each caller, with files that do not exist: the key is refused before any of them is opened
CALLERS = {
    "DenseRetriever()": (lambda p, **kw: DenseRetriever(p / "model", p / "index.faiss", **kw), list(DENSE_OPTIONS)),
    "dense_retrieve()": (lambda p, **kw: dense_retrieve(p / "model", p / "index.faiss", p / "passages.tsv",
                                                        p / "test.qa.tsv", p / "out.json", **kw),
                         _names(RetrieveConfig)),
    "hybrid_retrieve()": (lambda p, **kw: hybrid_retrieve(p / "bm25.json", p / "dense.json", p / "out.json", **kw),
                          _names(RetrieveConfig) + _names(HybridConfig)),
    "build_index()": (lambda p, **kw: build_index(p / "embeddings", **kw), _names(BuildOptions)),
    "BuildOptions.of": (lambda p, **kw: BuildOptions.of(None, **kw), _names(BuildOptions)),
}


@pytest.mark.parametrize("caller", list(CALLERS))
def test_each_caller_refuses_an_unknown_key_naming_it_and_the_known_ones(caller, tmp_path):
    call, known = CALLERS[caller]
    with pytest.raises(TypeError) as err:
        call(tmp_path, nprob=3)  # a typo of nprobe, a setting of every caller
    message = str(err.value)
    owner = "build_index()" if caller == "BuildOptions.of" else caller
    assert message == f"{owner} got unknown setting(s) 'nprob'; the known ones are {', '.join(known)}"
    assert "\n" not in message and list(tmp_path.iterdir()) == []


def test_a_dense_retriever_refuses_a_retrieval_setting_it_does_not_read(tmp_path):
    with pytest.raises(TypeError, match=r"DenseRetriever\(\) got unknown setting\(s\) 'k', 'match'; the known"):
        DenseRetriever(tmp_path / "model", tmp_path / "index.faiss", k=5, match="regex")


def test_known_keys_replace_the_fields_and_leave_the_base_as_it_was():
    base = RetrieveConfig(k=7, nprobe=2)
    got = with_overrides(base, {"nprobe": 9, "batch_size": 3}, "f()")
    assert (got.k, got.nprobe, got.batch_size) == (7, 9, 3) and base.nprobe == 2
    assert with_overrides(base, {}, "f()") == base
    assert with_overrides(base, {"nprobe": 1}, "f()", known=["nprobe"]).nprobe == 1
    with pytest.raises(TypeError, match=r"f\(\) got unknown setting\(s\) 'k'; the known ones are nprobe$"):
        with_overrides(base, {"k": 1}, "f()", known=["nprobe"])


@given(st.sets(st.sampled_from(["a", "b", "c", "x", "y"])))
def test_check_known_keys_names_exactly_the_unknown_ones(keys):
    unknown = sorted(keys - {"a", "b", "c"})
    if not unknown:
        check_known_keys(keys, ["a", "b", "c"], "f()")
        return
    with pytest.raises(TypeError) as err:
        check_known_keys(keys, ["a", "b", "c"], "f()")
    assert str(err.value) == f"f() got unknown setting(s) {', '.join(map(repr, unknown))}; the known ones are a, b, c"
