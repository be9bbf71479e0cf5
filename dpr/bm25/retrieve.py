"""BM25 retrieval to files: DPR results JSON for QA data, TREC runs for qrels data.

Thin names over the one retrieval stack (`dpr.api.BM25Retriever` + `dpr.api.records`), kept for
the pipeline, the CLI and the miner.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

import numpy as np

from dpr.api.passages import PassageStore
from dpr.api.records import RESULTS_CHUNK, iter_qa_records, trec_run, write_qa_records, write_trec_run
from dpr.api.retriever import BM25Retriever
from dpr.bm25.index import BM25Index

if TYPE_CHECKING:
    import datasets

    from dpr.data.dataset import DatasetPaths

log = logging.getLogger(__name__)

__all__ = ["RESULTS_CHUNK", "open_passages", "fetch_passages", "iter_qa_results", "retrieve_qa", "retrieve_qrels",
           "write_qa_results", "split_queries", "write_qrels_run", "retrieve_split"]


def open_passages(passages: "str | Path | datasets.Dataset") -> "datasets.Dataset":
    """A passages path or an already loaded dataset → the Arrow dataset."""
    return PassageStore(passages).ds


def fetch_passages(index: BM25Index, ds: "datasets.Dataset", rows: np.ndarray) -> dict[int, dict]:
    """``{row: {"id", "title", "text"}}`` for the distinct rows in ``rows``, checked against the index ids."""
    return PassageStore(ds).fetch_rows(rows, index.ids)


def iter_qa_results(index: BM25Index, qa_pairs: Sequence, passages: "str | Path | datasets.Dataset",
                    k: int = 100, n_threads: int = 0, match: str = "string") -> Iterator[dict]:
    """Yield one DPR results record per question (``question, answers, ctxs``), streaming."""
    return iter_qa_records(BM25Retriever(index, passages, n_threads=n_threads), qa_pairs, k=k, match=match)


def retrieve_qa(index: BM25Index, qa_pairs: Sequence, passages: "str | Path | datasets.Dataset", k: int = 100,
                n_threads: int = 0, match: str = "string") -> list[dict]:
    """DPR results records for ``qa_pairs`` (``(question, answers)`` pairs, e.g. `QAPair`)."""
    return list(iter_qa_results(index, qa_pairs, passages, k=k, n_threads=n_threads, match=match))


retrieve_to_results = retrieve_qa  # the name ARCHITECTURE.md lists


def retrieve_qrels(index: BM25Index, queries: Mapping[str, str], k: int = 100,
                   n_threads: int = 0) -> dict[str, dict[str, float]]:
    """A run ``{query_id: {passage_id: score}}`` for BEIR-style queries."""
    return trec_run(BM25Retriever(index, n_threads=n_threads), queries, k=k)


def write_qa_results(index: BM25Index, qa_path: str | Path, passages, output: str | Path, k: int = 100,
                     n_threads: int = 0) -> Path:
    """Retrieve for the questions of a QA TSV and write DPR results JSON (atomically)."""
    from dpr.retrieve import read_questions

    return write_qa_records(BM25Retriever(index, passages, n_threads=n_threads), read_questions(qa_path), output, k=k)


def split_queries(queries_path: str | Path, qrels_path: str | Path) -> dict[str, str]:
    """The queries of one split: those with a judgement in ``qrels_path`` (queries.jsonl holds all splits)."""
    from dpr.retrieve import read_split_queries

    return read_split_queries(queries_path, qrels_path)


def write_qrels_run(index: BM25Index, queries: Mapping[str, str], output: str | Path, k: int = 100,
                    n_threads: int = 0) -> Path:
    return write_trec_run(BM25Retriever(index, n_threads=n_threads), queries, output, k=k, tag="bm25")


def retrieve_split(index: BM25Index, ds: "DatasetPaths", splits: str | Sequence[str], output_dir: str | Path,
                   k: int = 100, n_threads: int = 0) -> dict[str, Path]:
    """Retrieve for each split of a prepared dataset into ``output_dir/<split>.json`` (QA data:
    ``<split>.qa.tsv``) or ``output_dir/<split>.trec`` (qrels data: queries of ``qrels/<split>.tsv``)."""
    from dpr.retrieve import retrieve_split_with

    retriever = BM25Retriever(index, None if ds.kind == "qrels" else ds.passages, n_threads=n_threads)
    ext = ".trec" if ds.kind == "qrels" else ".json"
    return {split: retrieve_split_with(retriever, ds, split, Path(output_dir) / f"{split}{ext}", k=k)
            for split in ([splits] if isinstance(splits, str) else splits)}
