"""BM25 hard negatives for DPR training (``hard_negative_ctxs``), as in the DPR paper.

For each training question, BM25's top passages (query = the question) become hard negatives unless
they are likely relevant: a positive of the question, a passage whose text or title contains one of
its answers (has_answer, string mode: a likely false negative), or, for qrels data, a document
judged for that query in any train/dev qrels. Passages sharing no term with the question (score 0,
which bm25s returns as padding) end the list: they are random, not hard, negatives. Rejections are
counted so the false-negative filter's effect is visible.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Mapping, Sequence

from dpr.atomic import sha256_file, write_json_atomic
from dpr.bm25.index import BM25Index
from dpr.bm25.search import search_indices
from dpr.eval.has_answer import has_answer
from dpr.retrieval.passages import PassageStore
from dpr.retrieval.records import RESULTS_CHUNK

if TYPE_CHECKING:
    import datasets

    from dpr.data.dataset import DatasetPaths

log = logging.getLogger(__name__)

MARKER_FILE = "bm25_mining.json"
# Keys under which an example may carry its query id (qrels data); the question text is tried last.
_QUERY_ID_KEYS = ("query_id", "qid", "_id", "id")


def _judged_docs(example: Mapping[str, Any], qrels: Mapping[str, Collection[str]] | None) -> Collection[str]:
    if not qrels:
        return ()
    for key in _QUERY_ID_KEYS:
        qid = example.get(key)
        if isinstance(qid, (str, int)) and str(qid) in qrels:
            return qrels[str(qid)]
    return qrels.get(example["question"], ())


def mine_hard_negatives(
    index: BM25Index,
    examples: Sequence[dict],
    passages: "str | Path | datasets.Dataset",
    num_negatives: int = 30,
    depth: int = 100,
    qrels: Mapping[str, Collection[str]] | None = None,
    n_threads: int = 0,
) -> tuple[list[dict], dict[str, int]]:
    """Return copies of ``examples`` with ``hard_negative_ctxs`` replaced by mined negatives, and counts.

    ``qrels`` maps a query id or a question text to the documents judged for it (any relevance);
    those are never negatives. Candidates are taken in BM25 order from the top ``depth``.
    """
    if num_negatives < 0 or depth < 1:
        raise ValueError(f"need num_negatives >= 0 and depth >= 1, got {num_negatives} and {depth}")
    ds = PassageStore(passages).ds  # loaded once; each chunk's rows are fetched from it
    counts: Counter = Counter()
    mined: list[dict] = []
    for start in range(0, len(examples), RESULTS_CHUNK):
        chunk = examples[start:start + RESULTS_CHUNK]
        rows, scores = search_indices(index, [ex["question"] for ex in chunk], depth, n_threads=n_threads)
        psg = PassageStore(ds).fetch_rows(rows, index.ids)  # checked against the index ids
        for ex, row_ids, row_scores in zip(chunk, rows.tolist(), scores.tolist()):
            positives = {str(c["passage_id"]) for c in ex.get("positive_ctxs") or []}
            judged = _judged_docs(ex, qrels)
            answers = ex.get("answers") or []
            negatives = []
            for r, s in zip(row_ids, row_scores):
                if len(negatives) >= num_negatives:
                    break
                if s <= 0.0:
                    # bm25s pads with zero-score passages when fewer than `depth` share a term with the
                    # question: those are random, not hard, negatives.
                    break
                p = psg[r]
                counts["examined"] += 1
                if p["id"] in positives:
                    counts["rejected_positive"] += 1
                elif p["id"] in judged:
                    counts["rejected_judged"] += 1
                elif answers and (has_answer(answers, p["text"]) or has_answer(answers, p["title"])):
                    counts["rejected_answer"] += 1
                else:
                    negatives.append({"passage_id": p["id"], "title": p["title"], "text": p["text"],
                                      "score": float(s)})
            counts["kept"] += len(negatives)
            counts["questions"] += 1
            if len(negatives) < num_negatives:
                counts["questions_short"] += 1
            mined.append({**ex, "hard_negative_ctxs": negatives})
    stats = {key: int(counts[key]) for key in ("questions", "examined", "kept", "rejected_positive",
                                                "rejected_answer", "rejected_judged", "questions_short")}
    log.info("mined %d hard negatives for %d questions; rejected %d positives, %d containing an answer "
             "(likely false negatives), %d judged in qrels; %d questions got fewer than %d",
             stats["kept"], stats["questions"], stats["rejected_positive"], stats["rejected_answer"],
             stats["rejected_judged"], stats["questions_short"], num_negatives)
    return mined, stats


def judged_from_dataset(ds: "DatasetPaths", splits: Sequence[str] = ("train", "dev")) -> dict[str, set[str]]:
    """Documents judged per query over the given qrels splits, keyed by query id and by query text."""
    from dpr.data.beir import read_qrels, read_queries

    queries = read_queries(ds.queries) if ds.queries.is_file() else {}
    judged: dict[str, set[str]] = {}
    for split in splits:
        path = ds.qrels(split)
        if not path.is_file():
            continue
        for qid, docs in read_qrels(path).items():
            judged.setdefault(qid, set()).update(docs)
            if qid in queries:
                judged.setdefault(queries[qid], set()).update(docs)
    return judged


def _marker_params(index: BM25Index, num_negatives: int, depth: int) -> dict[str, Any]:
    return {"index_key": index.meta.get("key"), "index_params": index.params,
            "passages": index.meta.get("passages"), "num_negatives": int(num_negatives), "depth": int(depth)}


def _split_files(ds: "DatasetPaths") -> dict[str, Path]:
    return {split: path for split, path in (("train", ds.train), ("dev", ds.dev)) if path.is_file()}


def mining_up_to_date(ds: "DatasetPaths", index: BM25Index, num_negatives: int = 30, depth: int = 100) -> bool:
    """True when the training files are those this miner last wrote, with the same index and settings."""
    marker = Path(ds.root) / MARKER_FILE
    if not marker.is_file():
        return False
    rec = json.loads(marker.read_text(encoding="utf-8"))
    if rec.get("params") != _marker_params(index, num_negatives, depth):
        return False
    files = _split_files(ds)
    return set(files) == set(rec.get("files", {})) and all(
        sha256_file(path) == rec["files"][split] for split, path in files.items())


def mine_dataset(
    index: BM25Index,
    ds: "DatasetPaths | str | Path",
    num_negatives: int = 30,
    depth: int = 100,
    n_threads: int = 0,
    force: bool = False,
) -> dict[str, dict[str, int]]:
    """Mine hard negatives into a prepared dataset's ``train.json`` and ``dev.json`` (rewritten atomically)
    and record it in ``bm25_mining.json``; skipped when already up to date (unless ``force``)."""
    from dpr.data.dataset import DatasetPaths
    from dpr.data.retriever_json import read_retriever_json, write_retriever_json

    if not isinstance(ds, DatasetPaths):
        ds = DatasetPaths(ds)
    files = _split_files(ds)
    if not files:
        raise FileNotFoundError(f"no train.json or dev.json in {ds.root} to mine negatives for")
    if not force and mining_up_to_date(ds, index, num_negatives, depth):
        log.info("hard negatives in %s are up to date", ds.root)
        return json.loads((Path(ds.root) / MARKER_FILE).read_text(encoding="utf-8"))["stats"]
    qrels = judged_from_dataset(ds) if ds.kind == "qrels" else None
    passages = PassageStore(ds.passages).ds
    all_stats: dict[str, dict[str, int]] = {}
    for split, path in files.items():
        examples = read_retriever_json(path)
        mined, stats = mine_hard_negatives(index, examples, passages, num_negatives=num_negatives, depth=depth,
                                           qrels=qrels, n_threads=n_threads)
        write_retriever_json(path, mined)
        all_stats[split] = stats
        log.info("%s: wrote %s", split, path)
    write_json_atomic(Path(ds.root) / MARKER_FILE, {
        "params": _marker_params(index, num_negatives, depth),
        "files": {split: sha256_file(path) for split, path in files.items()},
        "stats": all_stats,
    })
    return all_stats
