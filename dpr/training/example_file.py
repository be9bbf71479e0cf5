"""A training file read one question at a time: byte offsets and a few ids in memory, each record parsed on demand.

``json.load`` of a DPR retriever file holds every question with every ctx text as Python objects, ~4.5x the file's
size, in every rank. :class:`ExampleFile` scans the file once, streaming (one record in memory at a time), and keeps
per question only what batching needs for all of them: where its record lies in the file, its positive ids (the
batches' de-duplication), its topic (topic-aware batches) and its count of mined negatives (the top-up warning).
``examples[i]`` reads and validates record ``i`` from its bytes (the dict :func:`dpr.data.retriever_json.
validate_example` makes, as :func:`dpr.training.batching.load_examples` gives it); nothing is cached, so a rank holds
the records of the batches it is building and no more. The passages that top up short questions are found by
position (:meth:`ExampleFile.pool_locations`), their texts read when drawn.

Accepted input: a JSON list of objects (any layout: one per line, or pretty-printed as DPR's own files are).
Examples without a positive passage are skipped and counted, as :func:`~dpr.training.batching.load_examples` does.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from dpr.data.retriever_json import validate_example
from dpr.errors import DataError

log = logging.getLogger(__name__)

CHUNK = 1 << 22  # characters decoded per read while scanning
_WS = " \t\r\n"


def _scan(path: Path, chunk: int = CHUNK) -> Iterator[tuple[int, int, int, object]]:
    """``(record index, start byte, end byte, object)`` of each element of the top-level list, streaming."""
    import codecs

    dec = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        head = f.read(3)
        base = 3 if head == b"\xef\xbb\xbf" else 0
        f.seek(base)
        text, pos, byte, line, eof = "", 0, base, 1, False

        def more() -> bool:
            nonlocal text, pos, eof
            if eof:
                return False
            raw = f.read(chunk)
            try:
                add = utf8.decode(raw, final=not raw)
            except UnicodeDecodeError as err:
                raise DataError(path, f"not UTF-8 (byte {raw[err.start]:#04x})", line=line) from None
            eof = not raw
            text = text[pos:] + add
            pos = 0
            return bool(raw) or bool(add)

        def advance(to: int) -> None:
            nonlocal pos, byte, line
            piece = text[pos:to]
            byte += len(piece.encode("utf-8"))
            line += piece.count("\n")
            pos = to

        def skip_ws() -> str:
            while True:
                while pos < len(text) and text[pos] in _WS:
                    advance(pos + 1)
                if pos < len(text):
                    return text[pos]
                if not more():
                    return ""

        if skip_ws() != "[":
            raise DataError(path, "expected a JSON list of examples", line=line)
        advance(pos + 1)
        i = 0
        while True:
            c = skip_ws()
            if c == "]" and i == 0:
                return
            while True:
                try:
                    obj, end = dec.raw_decode(text, pos)
                    break
                except json.JSONDecodeError as err:
                    if not more():  # the whole rest of the file was there: truly broken
                        raise DataError(path, f"broken JSON: {err.msg}", line=line + text.count("\n", pos, err.pos)
                                        ) from None
            start = byte
            advance(end)
            yield i, start, byte, obj
            i += 1
            c = skip_ws()
            if c == "]":
                return
            if c != ",":
                raise DataError(path, "broken JSON: expecting ',' or ']' after an example", line=line)
            advance(pos + 1)


def count_records(path: str | Path) -> int:
    """The number of examples in a retriever JSON file, streamed (one record in memory at a time)."""
    return sum(1 for _ in _scan(Path(path)))


class ExampleFile(Sequence[dict]):
    """The examples of a DPR retriever JSON file that have a positive passage, each parsed when asked for.

    ``other_negatives``: whether a question's ``negative_ctxs`` count among its mined negatives (for the counts
    kept here: :meth:`mined_counts`). ``parsed`` counts the records parsed since the scan (tests read it)."""

    def __init__(self, path: str | Path, *, other_negatives: bool = True) -> None:
        self.path = Path(path)
        records, starts, ends, mined = [], [], [], []
        self.positive_ids: list[frozenset[str]] = []
        self.topics: list[str] = []
        first: dict[str, int] = {}  # passage id -> where it is first named (_where_code: one int, not a tuple)
        skipped = 0
        for rec, start, end, obj in _scan(self.path):
            ex = validate_example(self.path, obj, rec)
            if not ex["positive_ctxs"]:
                skipped += 1
                continue
            k = len(records)
            records.append(rec)
            starts.append(start)
            ends.append(end)
            self.positive_ids.append(frozenset(c["passage_id"] for c in ex["positive_ctxs"]))
            self.topics.append(str(ex["positive_ctxs"][0].get("title") or ""))
            mined.append(_mined_count(ex, other_negatives))
            for li, key in enumerate(POOL_KEYS):
                if len(ex[key]) >= 1 << 20:
                    raise DataError(self.path, f"{len(ex[key])} passages in one list", line=f"record {rec}", field=key)
                for j, c in enumerate(ex[key]):
                    first.setdefault(c["passage_id"], (k << 22) | (li << 20) | j)
        if skipped:
            log.info("%s: skipped %d of %d examples without a positive passage", self.path, skipped,
                     skipped + len(records))
        if not records:
            raise DataError(self.path, "no example has a positive passage (positive_ctxs)")
        self._records = np.asarray(records, dtype=np.int64)
        self._starts = np.asarray(starts, dtype=np.int64)
        self._ends = np.asarray(ends, dtype=np.int64)
        self._mined = np.asarray(mined, dtype=np.int64)
        ids = sorted(first)
        codes = np.fromiter((first[i] for i in ids), dtype=np.int64, count=len(ids))
        del first
        self._pool_ids = PassageIds(ids)
        self._pool_where = np.stack([codes >> 22, (codes >> 20) & 3, codes & ((1 << 20) - 1)], axis=1)
        self.parsed = 0
        self._fd = os.open(self.path, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        lo, hi = int(self._starts[i]), int(self._ends[i])
        raw = os.pread(self._fd, hi - lo, lo)  # thread-safe: the batch loader's thread reads too
        self.parsed += 1
        return validate_example(self.path, json.loads(raw.decode("utf-8")), int(self._records[i]))

    def __iter__(self) -> Iterator[dict]:
        for i in range(len(self)):
            yield self[i]

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def mined_counts(self) -> np.ndarray:
        """Each question's count of distinct mined negatives that are not its own positives."""
        return self._mined

    def pool_locations(self) -> tuple[Sequence[str], np.ndarray]:
        """Every passage any example names, sorted by id, and where its first mention is: ``[n, 3]`` rows of
        (example, ctx list in :data:`POOL_KEYS`, position)."""
        return self._pool_ids, self._pool_where


POOL_KEYS = ("positive_ctxs", "hard_negative_ctxs", "negative_ctxs")  # NegativePool's order of first sight


class PassageIds(Sequence[str]):
    """Passage ids in one UTF-8 byte array with offsets (~the ids' bytes + 8 a row, not a Python str each)."""

    def __init__(self, ids: Sequence[str]) -> None:
        raw = [i.encode("utf-8", "surrogatepass") for i in ids]
        self._offsets = np.concatenate([[0], np.cumsum([len(r) for r in raw], dtype=np.int64)]).astype(np.int64)
        self._bytes = b"".join(raw)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, j):  # type: ignore[override]
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self)))]
        lo, hi = int(self._offsets[j]), int(self._offsets[j + 1])
        return self._bytes[lo:hi].decode("utf-8", "surrogatepass")


def _mined_count(ex: dict, other_negatives: bool) -> int:
    own = {c["passage_id"] for c in ex["positive_ctxs"]}
    ids = set()
    for c in ex["hard_negative_ctxs"] + (ex["negative_ctxs"] if other_negatives else []):
        if c["passage_id"] not in own:
            ids.add(c["passage_id"])
    return len(ids)
