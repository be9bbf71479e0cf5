"""`Retriever.hybrid` fuses only retrievers over the same passages (the same ids, in any order)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpr import Retriever


def _tsv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("id\ttext\ttitle\n" + "".join(f"{i}\t{t}\tT\n" for i, t in rows), encoding="utf-8")
    return path


ROWS = [("a", "the cat sat on the mat"), ("b", "dogs chase cats"), ("c", "a bird in the hand")]


def test_same_passages_in_any_order_fuse(tmp_path):
    one = Retriever.bm25(_tsv(tmp_path / "one.tsv", ROWS))
    again = Retriever.bm25(_tsv(tmp_path / "rev.tsv", ROWS[::-1]))
    hits = Retriever.hybrid(one, again, fusion="rrf", depth=3).search_ids("cat", k=2)[0]
    assert {pid for pid, _ in hits} == {"a", "b"}  # the two about cats


def test_other_passages_are_refused(tmp_path):
    one = Retriever.bm25(_tsv(tmp_path / "one.tsv", ROWS))
    other = Retriever.bm25(_tsv(tmp_path / "other.tsv", [*ROWS[:2], ("z", "zebras")]))
    with pytest.raises(ValueError, match="hybrid: the BM25 index holds 3 passages and the dense index 3, not the same"):
        Retriever.hybrid(one, other, weight=0.5)
    fewer = Retriever.bm25(_tsv(tmp_path / "fewer.tsv", ROWS[:2]))
    with pytest.raises(ValueError, match="1 only in BM25, 0 only in dense; e.g. 'c' only in the BM25 index"):
        Retriever.hybrid(one, fewer, fusion="rrf")


def test_a_missing_dense_model_is_not_found(tmp_path):
    """Before: "index built by another model ... re-encode" for a model path that does not exist."""
    import faiss
    import numpy as np

    from dpr.index import save_index

    index = faiss.IndexFlatIP(4)
    index.add(np.eye(4, dtype=np.float32))
    save_index(index, ["a", "b", "c", "d"], tmp_path / "i.faiss", {"model_fingerprint": "0" * 64})
    with pytest.raises(FileNotFoundError, match=rf"model not found: {tmp_path / 'gone' / 'model'} \(no such directory\)"):
        Retriever.dense(tmp_path / "gone" / "model", tmp_path / "i.faiss")
