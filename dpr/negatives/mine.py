"""Hard negatives from any `Retriever` (BM25, dense, hybrid), through the one false-negative filter.

Each question's top ``depth`` passages (query = the question), in the retriever's order, become its
``hard_negative_ctxs`` (``{passage_id, title, text, score}``) unless `dpr.negatives.filters` rejects
them. The BM25 miner (`dpr.negatives.bm25`) is this over a `BM25Retriever`; dense re-mining
(`dpr.negatives.dense`) keeps its own search because its margin filter needs each question's score
against its positive, which the `Retriever` interface does not expose.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Collection, Mapping, Sequence

from dpr.negatives.filters import answer_check, select_negatives
from dpr.retrieval.records import RESULTS_CHUNK

if TYPE_CHECKING:
    from dpr.data.dataset import DatasetPaths
    from dpr.retrieval.retriever import Retriever

# Keys under which an example may carry its query id (qrels data); the question text is tried last.
_QUERY_ID_KEYS = ("query_id", "qid", "_id", "id")


def judged_docs(example: Mapping[str, Any], qrels: Mapping[str, Collection[str]] | None) -> Collection[str]:
    """The documents judged for ``example``'s query in ``qrels`` (by query id, else by question text)."""
    if not qrels:
        return ()
    for key in _QUERY_ID_KEYS:
        qid = example.get(key)
        if isinstance(qid, (str, int)) and str(qid) in qrels:
            return qrels[str(qid)]
    return qrels.get(example["question"], ())


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


def mine_examples(
    retriever: "Retriever",
    examples: Sequence[dict],
    *,
    num_negatives: int = 30,
    depth: int = 100,
    qrels: Mapping[str, Collection[str]] | None = None,
    skip_top: int = 0,
    end_at_score: float | None = None,
    check_title: bool = True,
) -> tuple[list[dict], Counter]:
    """Copies of ``examples`` with ``hard_negative_ctxs`` replaced by mined negatives, and the counts
    (``questions``, ``questions_short``, ``examined``, ``kept`` and each filter's).

    ``qrels`` maps a query id or a question text to the documents judged for it (never negatives).
    ``end_at_score``: a candidate scoring this or lower ends the list unexamined (BM25: 0, the padding
    of passages sharing no term with the question). ``check_title``: see `filters.answer_check`.
    The retriever needs its passages (``retriever.store``) for the texts.
    """
    if num_negatives < 0 or depth < 1:
        raise ValueError(f"need num_negatives >= 0 and depth >= 1, got {num_negatives} and {depth}")
    if retriever.store is None:
        raise ValueError(f"mining with the {retriever.name} retriever needs its passages (passages=)")
    counts: Counter = Counter()
    mined: list[dict] = []
    for start in range(0, len(examples), RESULTS_CHUNK):
        chunk = examples[start:start + RESULTS_CHUNK]
        ranked = retriever.search_ids([ex["question"] for ex in chunk], depth)
        psg = retriever.store.fetch([pid for row in ranked for pid, _ in row])
        for ex, row in zip(chunk, ranked):
            if end_at_score is not None:
                end = next((j for j, (_, s) in enumerate(row) if s <= end_at_score), len(row))
                row = row[:end]
            score_of = dict(row)
            kept, c = select_negatives(
                row, positives={str(p["passage_id"]) for p in ex.get("positive_ctxs") or []},
                judged=judged_docs(ex, qrels),
                contains_answer=answer_check(ex.get("answers") or [], psg.__getitem__, check_title=check_title),
                num_negatives=num_negatives, skip_top=skip_top)
            counts.update(c)
            counts["questions"] += 1
            if len(kept) < num_negatives:
                counts["questions_short"] += 1
            mined.append({**ex, "hard_negative_ctxs": [
                {"passage_id": pid, "title": psg[pid]["title"], "text": psg[pid]["text"], "score": score_of[pid]}
                for pid in kept]})
    return mined, counts
