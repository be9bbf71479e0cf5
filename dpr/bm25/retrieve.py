"""BM25 retrieval to files: DPR results JSON for QA data, TREC runs for qrels data.

Passage titles and texts of the top k come from the Arrow-backed passages dataset (`load_passages`):
row i of it is row i of the index, since both follow ``passages.tsv`` order.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

import numpy as np

from dpr.bm25.index import BM25Index
from dpr.bm25.search import search_indices
from dpr.errors import DataError
from dpr.eval.has_answer import has_answer

if TYPE_CHECKING:
    import datasets

    from dpr.data.dataset import DatasetPaths

log = logging.getLogger(__name__)

# Questions per round of search + passage fetch when streaming results to disk.
RESULTS_CHUNK = 2048


def open_passages(passages: "str | Path | datasets.Dataset") -> "datasets.Dataset":
    """A passages path or an already loaded dataset → the Arrow dataset."""
    if isinstance(passages, (str, Path)):
        from dpr.data.passages import load_passages

        return load_passages(passages)
    return passages


def fetch_passages(index: BM25Index, ds: "datasets.Dataset", rows: np.ndarray) -> dict[int, dict]:
    """``{row: {"id", "title", "text"}}`` for the distinct rows in ``rows``, checked against the index ids."""
    wanted = np.unique(rows).tolist()
    if wanted and wanted[-1] >= len(ds):
        raise DataError(None, f"BM25 index has {len(index)} passages but the passages file has {len(ds)}: "
                              "rebuild the index", field="id")
    batch = ds[wanted]
    out = {}
    for i, row in enumerate(wanted):
        pid = batch["id"][i]
        if pid != index.ids[row]:
            raise DataError(None, f"passage row {row} is {pid!r} in the passages file but {index.ids[row]!r} in "
                                  "the BM25 index: the index is stale, rebuild it", field="id")
        out[row] = {"id": pid, "title": batch["title"][i], "text": batch["text"][i]}
    return out


def iter_qa_results(
    index: BM25Index,
    qa_pairs: Sequence,
    passages: "str | Path | datasets.Dataset",
    k: int = 100,
    n_threads: int = 0,
    match: str = "string",
) -> Iterator[dict]:
    """Yield one DPR results record per question (``question, answers, ctxs``), streaming."""
    ds = open_passages(passages)
    for start in range(0, len(qa_pairs), RESULTS_CHUNK):
        chunk = qa_pairs[start:start + RESULTS_CHUNK]
        questions = [p[0] for p in chunk]
        rows, scores = search_indices(index, questions, k, n_threads=n_threads)
        psg = fetch_passages(index, ds, rows)
        for (question, answers), row_ids, row_scores in zip(chunk, rows.tolist(), scores.tolist()):
            ctxs = []
            for r, s in zip(row_ids, row_scores):
                p = psg[r]
                ctxs.append({"id": p["id"], "title": p["title"], "text": p["text"], "score": float(s),
                             "has_answer": has_answer(answers, p["text"], mode=match)})
            yield {"question": question, "answers": list(answers), "ctxs": ctxs}


def retrieve_qa(
    index: BM25Index,
    qa_pairs: Sequence,
    passages: "str | Path | datasets.Dataset",
    k: int = 100,
    n_threads: int = 0,
    match: str = "string",
) -> list[dict]:
    """DPR results records for ``qa_pairs`` (``(question, answers)`` pairs, e.g. `QAPair`)."""
    return list(iter_qa_results(index, qa_pairs, passages, k=k, n_threads=n_threads, match=match))


retrieve_to_results = retrieve_qa  # the name ARCHITECTURE.md lists


def retrieve_qrels(
    index: BM25Index, queries: Mapping[str, str], k: int = 100, n_threads: int = 0
) -> dict[str, dict[str, float]]:
    """A run ``{query_id: {passage_id: score}}`` for BEIR-style queries."""
    qids = list(queries)
    rows, scores = search_indices(index, [queries[q] for q in qids], k, n_threads=n_threads)
    ids = index.ids
    return {qid: {ids[r]: float(s) for r, s in zip(rr, ss)}
            for qid, rr, ss in zip(qids, rows.tolist(), scores.tolist())}


def write_qa_results(index: BM25Index, qa_path: str | Path, passages, output: str | Path, k: int = 100,
                     n_threads: int = 0) -> Path:
    """Retrieve for the questions of a QA TSV and write DPR results JSON (atomically)."""
    from dpr.data.qa import read_qa_tsv
    from dpr.data.results import write_results

    pairs = read_qa_tsv(qa_path)
    n = write_results(output, iter_qa_results(index, pairs, passages, k=k, n_threads=n_threads))
    log.info("wrote %d BM25 results to %s", n, output)
    return Path(output)


def split_queries(queries_path: str | Path, qrels_path: str | Path) -> dict[str, str]:
    """The queries of one split: those with a judgement in ``qrels_path`` (queries.jsonl holds all splits)."""
    from dpr.data.beir import read_qrels, read_queries

    queries = read_queries(queries_path)
    qrels = read_qrels(qrels_path)
    missing = [q for q in qrels if q not in queries]
    if missing:
        raise DataError(qrels_path, f"query id {missing[0]!r} is not in {queries_path}", field="query-id")
    return {q: queries[q] for q in qrels}


def write_qrels_run(index: BM25Index, queries: Mapping[str, str], output: str | Path, k: int = 100,
                    n_threads: int = 0) -> Path:
    from dpr.data.results import write_trec_run

    n = write_trec_run(output, retrieve_qrels(index, queries, k=k, n_threads=n_threads), tag="bm25")
    log.info("wrote a BM25 run (%d lines, %d queries) to %s", n, len(queries), output)
    return Path(output)


def retrieve_split(
    index: BM25Index,
    ds: "DatasetPaths",
    splits: str | Sequence[str],
    output_dir: str | Path,
    k: int = 100,
    n_threads: int = 0,
) -> dict[str, Path]:
    """Retrieve for each split of a prepared dataset into ``output_dir/<split>.json`` (QA data:
    ``<split>.qa.tsv``) or ``output_dir/<split>.trec`` (qrels data: queries of ``qrels/<split>.tsv``)."""
    if isinstance(splits, str):
        splits = [splits]
    output_dir = Path(output_dir)
    out = {}
    for split in splits:
        if ds.kind == "qrels":
            queries = split_queries(ds.queries, ds.qrels(split))
            out[split] = write_qrels_run(index, queries, output_dir / f"{split}.trec", k=k, n_threads=n_threads)
        else:
            out[split] = write_qa_results(index, ds.qa(split), ds.passages, output_dir / f"{split}.json", k=k,
                                          n_threads=n_threads)
    return out
