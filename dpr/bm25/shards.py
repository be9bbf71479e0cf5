"""A BM25 index built in shards of a fixed number of passages, so the build's peak memory is set by the
shard size, not by the corpus size.

The passages are tokenized in one stream (one vocabulary, so a term has one id in every shard). Each
shard's distinct (term, passage) pairs and their term frequencies are counted as soon as its passages
are read and spilled to disk, while the corpus-wide counts BM25 needs are accumulated: every term's
document frequency and every passage's length. Once the stream ends, each shard's weights are computed
from its spilled counts with the whole corpus' idf and average length, written as its own CSC
(``data``, ``indices`` local to the shard, ``indptr``) and memory-mapped. The weights are bit-identical
to those of the one-shot build (`dpr.bm25.weights.bm25_csc`): the same float arithmetic on the same
numbers, element by element. Search (`dpr.bm25.search`) scores shard by shard and merges the top k.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from dpr.bm25.weights import _term_doc_counts, bm25_norm, lucene_idf, pack_tokens, postings_csc

log = logging.getLogger(__name__)

SHARDS_DIR = "shards"
ARRAYS = ("data", "indices", "indptr")


@dataclass
class Shard:
    """One shard's postings: bm25s' ``scores`` dict over its passages (rows local to it), the first at ``start``."""

    start: int
    scores: dict[str, Any]

    @property
    def num_docs(self) -> int:
        return int(self.scores["num_docs"])


def shard_path(root: Path, i: int) -> Path:
    return Path(root) / SHARDS_DIR / f"{i:05d}"


def save_shard_arrays(scores: dict[str, Any], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ARRAYS:
        np.save(folder / f"{name}.npy", np.asarray(scores[name]))


def load_shards(root: Path, spans: Sequence[dict[str, int]]) -> list[Shard]:
    """The shards under ``root`` (memory-mapped: only the postings a search reads come into memory)."""
    shards = []
    for i, span in enumerate(spans):
        folder = shard_path(root, i)
        # plain ndarray views of the maps (np.memmap's own indexing costs ~10 us a slice, per term and query)
        scores: dict[str, Any] = {name: np.asarray(np.load(folder / f"{name}.npy", mmap_mode="r")) for name in ARRAYS}
        scores["num_docs"] = int(span["passages"])
        shards.append(Shard(start=int(span["start"]), scores=scores))
    return shards


def copy_shards(src_root: Path, dst_root: Path, n_shards: int) -> None:
    """Copy shard files (the kernel copies them: nothing passes through this process' memory)."""
    for i in range(n_shards):
        dst = shard_path(dst_root, i)
        dst.mkdir(parents=True, exist_ok=True)
        for name in ARRAYS:
            shutil.copyfile(shard_path(src_root, i) / f"{name}.npy", dst / f"{name}.npy")


def _spill(folder: Path, i: int, term: np.ndarray, doc: np.ndarray, tf: np.ndarray) -> None:
    np.save(folder / f"spill_{i:05d}.term.npy", term)
    np.save(folder / f"spill_{i:05d}.doc.npy", doc)
    np.save(folder / f"spill_{i:05d}.tf.npy", tf.astype(np.int32))


def _unspill(folder: Path, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arrays = tuple(np.load(folder / f"spill_{i:05d}.{name}.npy") for name in ("term", "doc", "tf"))
    for name in ("term", "doc", "tf"):
        (folder / f"spill_{i:05d}.{name}.npy").unlink()
    return arrays  # type: ignore[return-value]


def build_shards(
    first: tuple[np.ndarray, np.ndarray],
    stream: Iterator[Sequence[int]],
    shard_passages: int,
    vocab_size,
    k1: float,
    b: float,
    workdir: Path,
) -> list[Shard]:
    """Shards of ``shard_passages`` passages from token-id lists: ``first`` (the first shard, packed) then
    ``stream``. ``vocab_size()`` is the tokenizer's vocabulary size so far (it grows while streaming).
    Shards are written under ``workdir`` and returned memory-mapped."""
    workdir = Path(workdir)
    df = np.zeros(0, dtype=np.int64)
    doc_lens: list[np.ndarray] = []
    i, packed = 0, first
    while True:
        flat, offsets = packed
        if len(offsets) < 2:
            break
        term, doc, tf = _term_doc_counts(flat, offsets, 0)
        del flat
        counts = np.bincount(term, minlength=vocab_size())
        counts[: len(df)] += df
        df = counts
        doc_lens.append(np.diff(offsets))
        _spill(workdir, i, term, doc, tf)
        del term, doc, tf
        i += 1
        packed = pack_tokens(islice(stream, shard_passages))
    n_vocab = vocab_size()
    df = np.concatenate([df, np.zeros(n_vocab - len(df), dtype=np.int64)])
    doc_len = np.concatenate(doc_lens)
    n_docs = len(doc_len)
    # the one-shot build's corpus statistics, on the same arrays: the same idf, average length and norms
    idf = lucene_idf(df, n_docs)
    norm = bm25_norm(doc_len, float(doc_len.mean()), k1, b)
    shards, start = [], 0
    for s in tqdm(range(i), desc="BM25 shard weights", unit="shard", mininterval=1.0):
        term, doc, tf = _unspill(workdir, s)
        rows = len(doc_lens[s])
        scores = postings_csc(term, doc, tf, idf, norm[start:start + rows], n_vocab)
        del term, doc, tf
        save_shard_arrays(scores, shard_path(workdir, s))
        shards.append({"start": start, "passages": rows})
        start += rows
    log.info("BM25 index: %d shards of up to %d passages in %s", len(shards), shard_passages, workdir)
    return load_shards(workdir, shards)
