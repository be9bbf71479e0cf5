"""MS MARCO-style triples: a TSV with no header, ``query<TAB>positive<TAB>negative`` per line
(``triples.train.small.tsv``). With a collection (``data.corpus=<file>``: ``id<TAB>text`` per line, MS
MARCO's ``collection.tsv``; a third ``title`` field and an ``id<TAB>text[<TAB>title]`` header are
accepted) the positive and negative fields are passage ids into it and the whole collection becomes
``passages.tsv``; without one they are passage texts (content ids). With ``data.queries=<file>``
(``qid<TAB>query``, MS MARCO's ``queries.train.tsv``) the query field is a query id into it
(``qidpidtriples``), kept as the question's ``query_id``.

Lines of one query merge into one question (its positives and negatives in first-seen order);
negatives are imported as ``hard_negative_ctxs``. Export writes texts: one line per (positive,
negative) pair of each question; a question without negatives cannot be written (counted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

from dpr.atomic import atomic_path
from dpr.data._io import iter_lines
from dpr.data.formats.common import Collector, normalize, passage_string
from dpr.errors import DataError

EXTENSIONS = (".tsv",)
HAS_SCORES = False
FIELDS = ("query", "positive", "negative")


def read_corpus(path: str | Path, col: Collector) -> int:
    """Add every passage of an ``id<TAB>text[<TAB>title]`` collection to ``col``; returns the count."""
    path = Path(path)
    n, seen = 0, set()
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        parts = line.split("\t")
        if lineno == 1 and tuple(p.strip() for p in parts) in (("id", "text"), ("id", "text", "title")):
            continue  # a header
        if len(parts) not in (2, 3):
            raise DataError(path, f"expected 2 tab-separated fields (id, text) or 3 (id, text, title), got {len(parts)}",
                            line=lineno, field="id")
        pid = parts[0].strip()
        if not pid:
            raise DataError(path, "empty", line=lineno, field="id")
        if pid in seen:
            raise DataError(path, f"duplicate passage id {pid!r}", line=lineno, field="id")
        seen.add(pid)
        col.passage(path, lineno, "text", pid, parts[2] if len(parts) == 3 else "", parts[1])
        n += 1
    if not n:
        raise DataError(path, "no passages", line=1, field="id")
    return n


def read_queries_tsv(path: str | Path) -> dict[str, str]:
    """``{qid: query}`` of a ``qid<TAB>query`` file (duplicate ids and empty fields refused)."""
    path = Path(path)
    out: dict[str, str] = {}
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            raise DataError(path, f"expected 2 tab-separated fields (qid, query), got {len(parts)}", line=lineno, field="qid")
        qid, text = parts[0].strip(), parts[1]
        if not qid or not text.strip():
            raise DataError(path, "empty", line=lineno, field="qid" if not qid else "query")
        if qid in out:
            raise DataError(path, f"duplicate query id {qid!r}", line=lineno, field="qid")
        out[qid] = text
    return out


def read(path: str | Path, col: Collector, split: str = "train", corpus: Mapping | None = None,
         queries: Mapping[str, str] | None = None) -> None:
    """Add every triple of ``path`` to ``col``; with ``corpus`` (the collection, already in ``col``) the
    positive and negative fields are its ids, with ``queries`` the query field is a query id."""
    path = Path(path)
    first_row, worded = None, False  # without a corpus: does any passage field hold more than one word?
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        parts = line.split("\t")
        if corpus is None:
            first_row = first_row or (lineno, parts)
            worded = worded or any(len(p.split()) > 1 for p in parts[1:])
        if len(parts) != 3:
            raise DataError(path, f"expected 3 tab-separated fields (query, positive, negative), got {len(parts)}",
                            line=lineno, field=FIELDS[min(len(parts), 3) - 1])
        for name, value in zip(FIELDS, parts):
            if not value.strip():
                raise DataError(path, "empty", line=lineno, field=name)
        if corpus is not None:
            ids = []
            for name, pid in zip(FIELDS[1:], parts[1:]):
                pid = pid.strip()
                if pid not in corpus:
                    raise DataError(path, f"passage id {pid!r} is not in the collection", line=lineno, field=name)
                ids.append(pid)
        else:
            ids = [col.passage(path, lineno, name, None, "", text) for name, text in zip(FIELDS[1:], parts[1:])]
        query, qid = parts[0], None
        if queries is not None:
            qid = parts[0].strip()
            if qid not in queries:
                raise DataError(path, f"query id {qid!r} is not in the queries file", line=lineno, field="query")
            query = queries[qid]
        col.add(path, lineno, query, ids[:1], ids[1:], split=split, query_id=qid)
    if first_row is not None and not worded:
        # MS MARCO's id triples (qid, pid, pid) read as text would train on passages whose text is their id
        lineno, parts = first_row
        raise DataError(path, f"no passage has more than one word (line {lineno}: {parts[1].strip()!r}, "
                        f"{parts[2].strip()!r}): these look like id triples; pass data.corpus=<collection TSV: "
                        "pid TAB text> (and data.queries=<qid TAB query> if the queries are ids too)",
                        line=lineno, field="positive")


def write(path: str | Path, examples: Iterable[Mapping], scores: Mapping[str, Mapping[str, float]]) -> dict:
    """Write examples as text triples; returns counts (``dropped_questions``: questions without negatives)."""
    del scores
    n = dropped = 0
    with atomic_path(Path(path)) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for ex in examples:
            if not ex["hard_negative_ctxs"]:
                dropped += 1
                continue
            for p in ex["positive_ctxs"]:
                for neg in ex["hard_negative_ctxs"]:
                    f.write("\t".join(normalize(t) for t in (ex["question"], passage_string(p), passage_string(neg))) + "\n")
                    n += 1
    return {"records": n, "dropped_questions": dropped}
