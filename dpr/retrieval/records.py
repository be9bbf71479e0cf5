"""Retrieval output records: DPR results JSON for questions with answers, TREC runs for BEIR queries.

Built from `Hit` lists whatever retriever produced them, so BM25, dense and hybrid files agree in
every field (``has_answer`` by DPR's rule, `dpr.eval.has_answer`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

if TYPE_CHECKING:
    from dpr.retrieval.retriever import Hit, Retriever

log = logging.getLogger(__name__)

# Questions per round of search + passage fetch when streaming results to disk.
RESULTS_CHUNK = 2048


def qa_record(question: str, answers: Sequence[str], hits: Sequence["Hit"], match: str = "string") -> dict:
    """One DPR results record ``{question, answers, ctxs: [{id, title, text, score, has_answer}]}``."""
    from dpr.eval.has_answer import has_answer

    answers = list(answers)
    ctxs = [{"id": h.id, "title": h.title, "text": h.text, "score": float(h.score),
             "has_answer": has_answer(answers, h.text, mode=match)} for h in hits]
    return {"question": question, "answers": answers, "ctxs": ctxs}


def iter_qa_records(retriever: "Retriever", pairs: Sequence, k: int = 100, match: str = "string",
                    chunk: int = RESULTS_CHUNK) -> Iterator[dict]:
    """DPR results records for ``(question, answers)`` pairs, searched ``chunk`` questions at a time
    (streams: a big question set never holds every passage text at once)."""
    for start in range(0, len(pairs), chunk):
        part = pairs[start:start + chunk]
        for (question, answers), hits in zip(part, retriever.search([p[0] for p in part], k)):
            yield qa_record(question, answers, hits, match)


def trec_run(retriever: "Retriever", queries: Mapping[str, str], k: int = 100) -> dict[str, dict[str, float]]:
    """A run ``{query_id: {passage_id: score}}`` for BEIR-style queries (no passage texts needed)."""
    qids = list(queries)
    ranked = retriever.search_ids([queries[q] for q in qids], k)
    return {qid: {pid: float(s) for pid, s in row} for qid, row in zip(qids, ranked)}


def write_qa_records(retriever: "Retriever", pairs: Sequence, output: str | Path, k: int = 100,
                     match: str = "string") -> Path:
    """Retrieve for ``(question, answers)`` pairs and write DPR results JSON (atomically)."""
    from dpr.data.results import write_results

    n = write_results(output, iter_qa_records(retriever, pairs, k=k, match=match))
    log.info("wrote %s results for %d questions to %s", retriever.name, n, output)
    return Path(output)


def write_trec_run(retriever: "Retriever", queries: Mapping[str, str], output: str | Path, k: int = 100,
                   tag: str | None = None) -> Path:
    """Retrieve for BEIR queries and write a TREC run (atomically)."""
    from dpr.data.results import write_trec_run as write_run

    n = write_run(output, trec_run(retriever, queries, k=k), tag or retriever.name)
    log.info("wrote a %s run (%d lines, %d queries) to %s", retriever.name, n, len(queries), output)
    return Path(output)
