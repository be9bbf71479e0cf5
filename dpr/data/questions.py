"""Question files: (question, answers) pairs from a QA TSV or retriever JSON, BEIR queries of one split,
and which question file(s) a split of a prepared dataset has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpr.errors import DataError

__all__ = ["read_questions", "read_split_queries", "split_questions"]


def read_questions(path: str | Path) -> list[tuple[str, list[str]]]:
    """(question, answers) pairs from a ``.qa.tsv`` file or a DPR retriever ``.json`` (e.g. dev.json)."""
    path = Path(path)
    if path.suffix == ".json":
        from dpr.data.retriever_json import read_retriever_json

        return [(ex["question"], list(ex["answers"])) for ex in read_retriever_json(path)]
    from dpr.data.qa import read_qa_tsv

    return [(p.question, list(p.answers)) for p in read_qa_tsv(path)]


def read_split_queries(queries_path: str | Path, qrels_path: str | Path | None = None) -> dict[str, str]:
    """BEIR queries, restricted to those judged in ``qrels_path`` when given (queries.jsonl holds every split)."""
    from dpr.data.beir import read_qrels, read_queries

    queries = read_queries(queries_path)
    if qrels_path is None:
        return queries
    judged = read_qrels(qrels_path)
    missing = [q for q in judged if q not in queries]
    if missing:
        raise DataError(qrels_path, f"{len(missing)} judged queries absent from {queries_path}, e.g. {missing[0]!r}",
                        field="query-id")
    return {qid: text for qid, text in queries.items() if qid in judged}


def split_questions(ds: Any, split: str) -> dict[str, Path]:
    """The question file(s) of one split of a prepared dataset (`dpr.data.dataset.DatasetPaths`):
    ``queries`` + ``qrels`` for qrels data, else ``qa`` (``<split>.qa.tsv``, else ``<split>.json``)."""
    if ds.has_qrels:
        return {"queries_path": Path(ds.queries), "qrels_path": Path(ds.qrels(split))}
    qa = Path(ds.qa(split))
    if not qa.is_file() and (Path(ds.root) / f"{split}.json").is_file():
        qa = Path(ds.root) / f"{split}.json"  # a dataset with retriever JSON only for this split
    return {"qa_path": qa}
