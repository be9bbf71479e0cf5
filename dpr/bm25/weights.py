"""BM25 weights of every (term, passage) pair, computed with numpy in bm25s' own index layout.

bm25s builds its index with a Python loop over passages (a Counter per passage) from lists of
Python ints: ~36 bytes a token and minutes for millions of passages. This computes the same matrix
(bm25s' "lucene" variant, same float32 arithmetic) from one int32 token array and passage offsets,
and hands it to a `bm25s.BM25` object, so bm25s' save/load and retrieval work on it unchanged. The
tests compare the arrays with those bm25s builds itself.
"""

from __future__ import annotations

from array import array
from typing import Iterable, Sequence

import numpy as np

# Passages per chunk when counting (term, passage) pairs: bounds the int64 sort keys in memory.
_CHUNK_TOKENS = 1 << 25


def pack_tokens(docs: Iterable[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of every passage as one int32 array plus int64 offsets (``len(docs) + 1``)."""
    flat, offsets = array("i"), array("q", [0])
    for doc in docs:
        flat.extend(doc)
        offsets.append(len(flat))
    return np.frombuffer(flat, dtype=np.int32), np.frombuffer(offsets, dtype=np.int64)


def _term_doc_counts(flat: np.ndarray, offsets: np.ndarray, n_vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (term, passage) pairs sorted by term then passage, with their term frequencies."""
    n_docs = len(offsets) - 1
    terms, docs, tfs = [], [], []
    start_doc = 0
    while start_doc < n_docs:
        # whole passages, about _CHUNK_TOKENS tokens at a time
        stop_doc = int(np.searchsorted(offsets, offsets[start_doc] + _CHUNK_TOKENS, side="right")) - 1
        stop_doc = min(n_docs, max(stop_doc, start_doc + 1))
        lo, hi = int(offsets[start_doc]), int(offsets[stop_doc])
        lengths = np.diff(offsets[start_doc:stop_doc + 1])
        doc_of = np.repeat(np.arange(start_doc, stop_doc, dtype=np.int64), lengths)
        keys, counts = np.unique(flat[lo:hi].astype(np.int64) * n_docs + doc_of, return_counts=True)
        terms.append((keys // n_docs).astype(np.int32))
        docs.append((keys % n_docs).astype(np.int32))
        tfs.append(counts)
        start_doc = stop_doc
    term = np.concatenate(terms)
    doc = np.concatenate(docs)
    tf = np.concatenate(tfs)
    if len(terms) > 1:
        # chunks are in passage order, so a stable sort by term keeps passages ascending within a term
        order = np.argsort(term, kind="stable")
        term, doc, tf = term[order], doc[order], tf[order]
    return term, doc, tf


def bm25_csc(
    flat: np.ndarray, offsets: np.ndarray, n_vocab: int, k1: float, b: float
) -> dict[str, np.ndarray | int]:
    """bm25s' ``scores`` dict (CSC of shape ``[passages, terms]``: data, indices, indptr, num_docs).

    Lucene BM25: ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``,
    ``weight = idf * tf / (tf + k1 * (1 - b + b * len / avg_len))``, where len counts every token of
    the passage (after stopwords), as bm25s does.
    """
    n_docs = len(offsets) - 1
    doc_len = np.diff(offsets)
    avg_len = float(doc_len.mean())
    term, doc, tf = _term_doc_counts(flat, offsets, n_vocab)
    df = np.bincount(term, minlength=n_vocab)
    idf = lucene_idf(df, n_docs)
    return {**postings_csc(term, doc, tf, idf, bm25_norm(doc_len, avg_len, k1, b), n_vocab), "num_docs": n_docs}


def lucene_idf(df: np.ndarray, n_docs: int) -> np.ndarray:
    """Lucene's idf of every term from its document frequency over the whole corpus (float32, as bm25s stores it)."""
    # bm25s' arithmetic, so the weights are bit-identical: idf computed in float64 and stored as float32
    with np.errstate(divide="ignore"):
        return np.where(df > 0, np.log(1.0 + (n_docs - df + 0.5) / (df + 0.5)), 0.0).astype(np.float32)


def bm25_norm(doc_len: np.ndarray, avg_len: float, k1: float, b: float) -> np.ndarray:
    """``k1 * (1 - b + b * len / avg_len)`` per passage (float64; avg_len is the whole corpus' mean length)."""
    return k1 * ((1 - b) + b * doc_len / avg_len)


def postings_csc(term: np.ndarray, doc: np.ndarray, tf: np.ndarray, idf: np.ndarray, norm: np.ndarray,
                 n_vocab: int) -> dict[str, np.ndarray | int]:
    """The CSC of (term, passage, tf) triplets sorted by term then passage; ``norm[doc]`` is the passage's
    length factor. A shard of a corpus (``doc`` local to it, ``norm`` its slice of the corpus' factors) gets
    the weights the whole corpus' index holds for its passages: ``idf`` and ``norm`` are the whole corpus'."""
    # the tf part in float64 (its average length is a numpy float64); the product rounded to float32 when stored
    tf64 = tf.astype(np.float64)
    data = idf[term].astype(np.float64) * (tf64 / (norm[doc] + tf64))
    indptr = np.zeros(n_vocab + 1, dtype=np.int64)
    np.cumsum(np.bincount(term, minlength=n_vocab), out=indptr[1:])
    return {"data": data.astype(np.float32), "indices": doc, "indptr": indptr}
