"""BEIR layout: ``corpus.jsonl`` (``{_id, title, text}``), ``queries.jsonl`` (``{_id, text}``) and
``qrels/<split>.tsv`` (header ``query-id<TAB>corpus-id<TAB>score``; CRLF accepted, as in BEIR's zips)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Collection, Iterable, Iterator, Mapping

from dpr.atomic import atomic_path
from dpr.data._io import get_id, get_str, iter_jsonl, iter_lines
from dpr.errors import DataError

QRELS_HEADER = ("query-id", "corpus-id", "score")


def iter_beir_corpus(path: str | Path) -> Iterator[dict]:
    """Yield ``{"id", "text", "title"}`` per document of a BEIR ``corpus.jsonl`` (validated, streaming).

    A document may have an empty text if its title is not empty (BEIR's loaders accept that; what to
    do with it is the caller's choice, see the nfcorpus recipe); both empty, a missing ``_id`` or a
    duplicate ``_id`` is a `DataError`.
    """
    path = Path(path)
    seen: set[str] = set()
    for lineno, obj in iter_jsonl(path):
        did = get_id(path, obj, "_id", lineno)
        if did in seen:
            raise DataError(path, f"duplicate document id {did!r}", line=lineno, field="_id")
        seen.add(did)
        title = get_str(path, obj, "title", lineno, nonempty=False, required=False)
        text = get_str(path, obj, "text", lineno, nonempty=False)
        if not text.strip() and not title.strip():
            raise DataError(path, f"empty text and title for document {did!r}", line=lineno, field="text")
        yield {"id": did, "text": text, "title": title}


def read_queries(path: str | Path) -> dict[str, str]:
    """Read a BEIR ``queries.jsonl`` into ``{query_id: text}`` (file order kept; duplicates rejected)."""
    path = Path(path)
    queries: dict[str, str] = {}
    for lineno, obj in iter_jsonl(path):
        qid = get_id(path, obj, "_id", lineno)
        if qid in queries:
            raise DataError(path, f"duplicate query id {qid!r}", line=lineno, field="_id")
        queries[qid] = get_str(path, obj, "text", lineno)
    return queries


def read_qrels(
    path: str | Path,
    query_ids: Collection[str] | None = None,
    doc_ids: Collection[str] | None = None,
) -> dict[str, dict[str, int]]:
    """Read a BEIR qrels TSV into ``{query_id: {doc_id: relevance}}`` (file order kept).

    With ``query_ids`` / ``doc_ids`` given, an id outside them is a `DataError`; so are a wrong
    header, a non-integer score and a pair listed twice.
    """
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    lines = iter_lines(path)
    first = next(lines, None)
    if first is None or tuple(h.strip() for h in first[1].split("\t")) != QRELS_HEADER:
        got = first[1][:80] if first else ""
        raise DataError(path, f"expected header 'query-id<TAB>corpus-id<TAB>score', got {got!r}", line=1, field="header")
    for lineno, line in lines:
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            raise DataError(path, f"expected 3 tab-separated fields, got {len(parts)}", line=lineno, field="query-id")
        qid, did, score = (p.strip() for p in parts)
        if not qid:
            raise DataError(path, "empty", line=lineno, field="query-id")
        if not did:
            raise DataError(path, "empty", line=lineno, field="corpus-id")
        try:
            rel = int(score)
        except ValueError:
            raise DataError(path, f"not an integer: {score!r}", line=lineno, field="score") from None
        if query_ids is not None and qid not in query_ids:
            raise DataError(path, f"unknown query id {qid!r}", line=lineno, field="query-id")
        if doc_ids is not None and did not in doc_ids:
            raise DataError(path, f"unknown corpus id {did!r}", line=lineno, field="corpus-id")
        docs = qrels.setdefault(qid, {})
        if did in docs:
            raise DataError(path, f"pair ({qid!r}, {did!r}) listed twice", line=lineno, field="corpus-id")
        docs[did] = rel
    return qrels


def write_queries(path: str | Path, queries: Mapping[str, str] | Iterable[tuple[str, str]]) -> int:
    """Write ``{query_id: text}`` (or pairs) as BEIR ``queries.jsonl`` (``{"_id", "text"}``), atomically."""
    path = Path(path)
    items = queries.items() if isinstance(queries, Mapping) else queries
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for qid, text in items:
            if not str(qid).strip() or not text.strip():
                raise DataError(path, f"empty id or text for query {qid!r}", line=f"row {n}", field="text")
            f.write(json.dumps({"_id": str(qid), "text": text}, ensure_ascii=False) + "\n")
            n += 1
    return n


def write_qrels(path: str | Path, qrels: Mapping[str, Mapping[str, int]]) -> int:
    """Write ``{query_id: {doc_id: relevance}}`` as a BEIR qrels TSV (LF endings), atomically."""
    path = Path(path)
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write("\t".join(QRELS_HEADER) + "\n")
        for qid, docs in qrels.items():
            for did, rel in docs.items():
                if any(c.isspace() for c in f"{qid}{did}") or not qid or not did:
                    raise DataError(path, f"invalid id in pair ({qid!r}, {did!r})", line=f"row {n}", field="query-id")
                f.write(f"{qid}\t{did}\t{int(rel)}\n")
                n += 1
    return n


def write_beir_corpus(path: str | Path, docs: Iterable[Mapping[str, str]]) -> int:
    """Write ``{"id", "text", "title"}`` dicts as BEIR ``corpus.jsonl`` (``{"_id", "title", "text"}``)."""
    path = Path(path)
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for d in docs:
            f.write(json.dumps({"_id": str(d["id"]), "title": d.get("title", ""), "text": d["text"]}, ensure_ascii=False) + "\n")
            n += 1
    return n


def check_qrels_corpus(qrels_path: str | Path, passages_path: str | Path) -> dict[str, dict[str, int]]:
    """``read_qrels`` with every judged document checked to be a passage of ``passages_path``: a qrels
    id missing from the corpus would silently count as a relevant document no system can retrieve."""
    from dpr.data.passages import iter_passages

    ids = {p["id"] for p in iter_passages(passages_path, check_unique=False)}
    return read_qrels(qrels_path, doc_ids=ids)
