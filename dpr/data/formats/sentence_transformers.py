"""sentence-transformers training sets: a table whose first column is the anchor (question), the second
the positive, every further text column a negative (``negative`` or ``negative_1..n``: the triplet and
n-tuple layouts of ``sentence_transformers.util.mine_hard_negatives``), and optionally ``scores``, the
miner's ``output_scores=True`` column: ``[positive score, negative scores...]`` per row.

Files: ``.parquet`` (read through the ``datasets`` library), ``.jsonl`` and ``.csv`` (read here, so an
error names the exact line; in CSV ``scores`` is a JSON list). Columns are positional, as in
sentence-transformers' own trainer; labeled layouts (``label``/``score`` columns) are refused. Rows
of one anchor merge into one question; negatives are imported as ``hard_negative_ctxs``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from dpr.atomic import atomic_path
from dpr.data._io import iter_jsonl, iter_lines
from dpr.data.formats.common import Collector, check_scores, passage_string
from dpr.errors import DataError

EXTENSIONS = (".parquet", ".jsonl", ".csv")
HAS_SCORES = True
SCORES = "scores"
LABELS = ("label", "labels", "score")


def _rows_parquet(path: Path) -> tuple[list[str], Iterator[tuple[str, dict]]]:
    import datasets

    try:
        ds = datasets.Dataset.from_parquet(str(path))
    except Exception as err:  # pyarrow's and datasets' many error types: the file is not a parquet table
        first = (str(err).splitlines() or [type(err).__name__])[0][:200]
        raise DataError(path, f"not a readable parquet table ({type(err).__name__}: {first})", line="row 0") from None
    return list(ds.column_names), ((f"row {i + 1}", row) for i, row in enumerate(ds))


def _rows_jsonl(path: Path) -> tuple[list[str], Iterator[tuple[str, dict]]]:
    records = iter_jsonl(path)
    first = next(records, None)
    if first is None:
        raise DataError(path, "empty file: no rows", line=1)
    columns = list(first[1])

    def rows() -> Iterator[tuple[int, dict]]:
        yield first
        for lineno, obj in records:
            if list(obj) != columns:
                raise DataError(path, f"columns {list(obj)} differ from the first line's {columns}", line=lineno)
            yield lineno, obj
    return columns, rows()


def _rows_csv(path: Path) -> tuple[list[str], Iterator[tuple[int, dict]]]:
    lines = iter_lines(path)  # decodes with line numbers (non-UTF-8 named by line)
    numbered: list[int] = []

    def text() -> Iterator[str]:
        for lineno, line in lines:
            numbered.append(lineno)
            yield line + "\n"

    reader = csv.reader(text())
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(path, "empty file: expected a header line", line=1) from None

    def rows() -> Iterator[tuple[int, dict]]:
        start = 2
        try:
            for fields in reader:
                lineno, start = start, numbered[-1] + 1
                if not fields:
                    continue
                if len(fields) != len(header):
                    raise DataError(path, f"expected {len(header)} fields ({', '.join(header)}), got {len(fields)}",
                                    line=lineno, field=header[min(len(fields), len(header)) - 1] if fields else None)
                yield lineno, dict(zip(header, fields))
        except csv.Error as err:
            raise DataError(path, f"broken CSV: {err}", line=start) from None
    return header, rows()


def _columns(path: Path, columns: list[str]) -> tuple[list[str], bool]:
    labels = [c for c in columns if c in LABELS]
    if labels:
        raise DataError(path, f"labeled layout (column {labels[0]!r}) is not supported: give anchor, positive, "
                        "negative(_1..n) columns and optionally scores", field=labels[0])
    texts = [c for c in columns if c != SCORES]
    if len(texts) < 2:
        raise DataError(path, f"expected at least an anchor and a positive column, got {columns}", field="columns")
    return texts, SCORES in columns


def _text(path: Path, row: dict, col: str, where: Any) -> str:
    value = row.get(col)
    if value is None:
        raise DataError(path, "missing", line=where, field=col)
    if not isinstance(value, str):
        raise DataError(path, f"expected a string, got {type(value).__name__}", line=where, field=col)
    if not value.strip():
        raise DataError(path, "empty", line=where, field=col)
    return value


def read(path: str | Path, col: Collector, split: str = "train", corpus: Mapping | None = None) -> None:
    """Add every row of a sentence-transformers table to ``col``."""
    path = Path(path)
    readers = {".parquet": _rows_parquet, ".jsonl": _rows_jsonl, ".csv": _rows_csv}
    if path.suffix not in readers:
        raise DataError(path, f"unknown file type {path.suffix!r} (expected {', '.join(readers)})", field="path")
    columns, rows = readers[path.suffix](path)
    texts, has_scores = _columns(path, columns)
    for where, row in rows:
        query = _text(path, row, texts[0], where)
        ids = [col.passage(path, where, c, None, "", _text(path, row, c, where)) for c in texts[1:]]
        scores: dict[str, float] = {}
        if has_scores:
            value = row.get(SCORES)
            if isinstance(value, str):  # CSV: a JSON list
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    raise DataError(path, f"expected a JSON list of numbers, got {value[:40]!r}", line=where,
                                    field=SCORES) from None
            for pid, s in zip(ids, check_scores(path, value, len(ids), where, SCORES)):
                if scores.get(pid, s) != s:
                    raise DataError(path, f"passage listed twice with two scores ({pid})", line=where, field=SCORES)
                scores[pid] = s
        col.add(path, where, query, ids[:1], ids[1:], split=split, scores=scores, field=texts[0])


def _layout(examples: list[Mapping]) -> tuple[str, int]:
    counts = {len(ex["hard_negative_ctxs"]) for ex in examples}
    if counts <= {0}:
        return "pair", 0
    if len(counts) == 1:
        return "n-tuple", counts.pop()
    return "triplet", 1


def write(path: str | Path, examples: Iterable[Mapping], scores: Mapping[str, Mapping[str, float]]) -> dict:
    """Write examples as a sentence-transformers table (by ``path``'s suffix: .parquet, .jsonl, .csv).

    Layout: every question with the same number k of hard negatives → one row per positive with
    ``negative`` (k = 1) or ``negative_1..k``; differing numbers → triplets, one row per positive and
    negative (nothing lost; a question without negatives cannot be written then, and is counted in
    ``dropped_questions``); no negatives anywhere → (anchor, positive) pairs. ``scores`` is written when
    every row's passages have teacher scores. Returns counts and the layout.
    """
    path = Path(path)
    if path.suffix not in EXTENSIONS:
        raise DataError(path, f"unknown file type {path.suffix!r} (expected {', '.join(EXTENSIONS)})", field="output")
    examples = list(examples)
    layout, k = _layout(examples)
    negcols = ["negative"] if k == 1 else [f"negative_{i}" for i in range(1, k + 1)]
    names = ["anchor", "positive", *([] if layout == "pair" else negcols)]
    rows, row_scores, dropped = [], [], 0
    for ex in examples:
        qs = scores.get(ex.get("query_id") or "", {})
        negs = ex["hard_negative_ctxs"]
        if layout == "triplet" and not negs:
            dropped += 1
            continue
        for p in ex["positive_ctxs"]:
            groups = [[n] for n in negs] if layout == "triplet" else [negs]
            for g in groups:
                ctxs = [p, *g]
                rows.append([ex["question"], *(passage_string(c) for c in ctxs)])
                row_scores.append([qs.get(c["passage_id"]) for c in ctxs])
    with_scores = bool(rows) and all(s is not None for r in row_scores for s in r)
    table = {n: [r[i] for r in rows] for i, n in enumerate(names)}
    if with_scores:
        table[SCORES] = row_scores
    with atomic_path(path) as tmp:
        if path.suffix == ".parquet":
            import datasets

            datasets.Dataset.from_dict(table).to_parquet(str(tmp))
        else:
            cols = list(table)
            with open(tmp, "w", encoding="utf-8", newline="") as f:
                if path.suffix == ".csv":
                    w = csv.writer(f, lineterminator="\n")
                    w.writerow(cols)
                    for i in range(len(rows)):
                        w.writerow([json.dumps(table[c][i]) if c == SCORES else table[c][i] for c in cols])
                else:
                    for i in range(len(rows)):
                        f.write(json.dumps({c: table[c][i] for c in cols}, ensure_ascii=False) + "\n")
    return {"records": len(rows), "layout": layout, "negatives_per_row": k if layout != "pair" else 0,
            "dropped_questions": dropped, "with_scores": with_scores}
