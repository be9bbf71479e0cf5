"""What kind of file stands at an output path, sniffed from its first bytes: a file output may replace only a
file of the kind its command writes, never the user's training file or corpus; a file a command writes inside an
output directory (:data:`INSIDE`, by name) likewise replaces only an earlier output of that name.

One function per kind, each given the file's first :data:`HEAD` bytes (never the whole file), True when they
look like what the project's writer of that kind produces. :func:`foreign` answers the question
`dpr.atomic.check_replaceable` asks: None where the file may be replaced, else what it looks like.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Callable

HEAD = 1 << 16  # enough for the first record of every writer below; the rest of the file is never read

_LIST_START = re.compile(rb"^\s*\[\s*(\]|\{)")


def dpr_results(head: bytes) -> bool:
    """A DPR results JSON (`dpr.data.results.write_results`): a list of ``{question, answers, ctxs}``; a training
    file (``positive_ctxs``, no ``ctxs`` key) is not one."""
    m = _LIST_START.match(head)
    return bool(m) and (m.group(1) == b"]" or re.search(rb'"ctxs"\s*:', head) is not None)


def trec_run(head: bytes) -> bool:
    """A TREC run (`dpr.data.results.write_trec_run`): lines ``qid Q0 docid rank score tag``."""
    fields = _first_line(head).split()
    if len(fields) != 6:
        return False
    try:
        int(fields[3]), float(fields[4])
    except ValueError:
        return False
    return True


_FAISS_DUMMY = struct.pack("<qq", 1 << 20, 1 << 20)  # faiss's index header: fourcc, d, ntotal, then these two


def faiss_index(head: bytes) -> bool:
    """A FAISS index (``faiss.write_index``): a 4-letter type code, then the header's fixed ``1 << 20`` pair."""
    return len(head) >= 32 and head[:1] == b"I" and head[:4].isalnum() and head[16:32] == _FAISS_DUMMY


def _first_record(head: bytes) -> dict | None:
    try:
        rec = json.loads(_first_line(head))
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def teacher_scores(head: bytes) -> bool:
    """A teacher-scores jsonl (`dpr.training.teacher_scores`, `dpr.data.formats.scores`): ``passage_ids`` and
    ``scores`` per line."""
    rec = _first_record(head)
    return rec is not None and {"passage_ids", "scores"} <= rec.keys()


def reader_eval(head: bytes) -> bool:
    """`dpr-reader eval`'s report (`dpr.reader.evaluate.evaluate_reader`): ``{"model": ..., "figures": ...}``."""
    return re.match(rb'^\s*\{\s*"model"\s*:', head) is not None and b'"figures"' in head


_EXPORT_KEYS = ({"query", "positive_passages"}, {"query", "pos"}, {"anchor", "positive"})


def training_export(head: bytes) -> bool:
    """A `dpr-data export` file: Tevatron / FlagEmbedding / sentence-transformers jsonl, a sentence-transformers
    csv (``anchor,positive,...`` header) or parquet, or triples (3 tab-separated fields)."""
    if head.startswith(b"PAR1"):
        return True
    line = _first_line(head)
    rec = _first_record(head)
    if rec is not None:
        return any(keys <= rec.keys() for keys in _EXPORT_KEYS)
    return line.startswith(b"anchor,positive") or (line.count(b"\t") == 2 and not _corpus(line))


def _corpus(line: bytes) -> bool:
    """A passages TSV's header (``id, text, title``): three tab-separated fields too, but the user's corpus."""
    return line.split(b"\t")[:2] == [b"id", b"text"]


def _first_line(head: bytes) -> bytes:
    return head.split(b"\n", 1)[0].rstrip(b"\r")


KINDS: dict[str, tuple[Callable[[bytes], bool], str]] = {
    "dpr_results": (dpr_results, "a DPR results JSON"),
    "trec_run": (trec_run, "a TREC run"),
    "faiss_index": (faiss_index, "a FAISS index"),
    "teacher_scores": (teacher_scores, "a teacher-scores jsonl"),
    "reader_eval": (reader_eval, "a reader evaluation JSON"),
    "training_export": (training_export, "an exported training set"),
}


def looks_like(head: bytes) -> str:
    """What a file that is none of the expected kinds looks like, for the refusal."""
    for check, name in KINDS.values():
        if check(head):
            return name
    if re.match(rb'^\s*\[\s*\{', head) and b'"positive_ctxs"' in head:
        return "a DPR training file"
    if _corpus(_first_line(head)):
        return "a passages TSV"
    if re.match(rb"^\s*[\[{]", head):
        return "a JSON file"
    if b"\0" in head[:1024]:
        return "a binary file"
    return "a text file"


def model_card(head: bytes) -> bool:
    """A model card (`dpr.model_card`): YAML front matter tagged ``dense-retrieval``."""
    return head.lstrip().startswith(b"---") and b"dense-retrieval" in head


def metrics_rows(head: bytes) -> bool:
    """A trainer's ``metrics.jsonl`` / ``validation.jsonl`` (`dpr.trainkit.metrics_log`): a ``step`` per row."""
    rec = _first_record(head)
    # a first row cut short by a kill still starts as every row the logger writes does
    return (rec is not None and isinstance(rec.get("step"), int)) or re.match(rb'^\{"step": \d', head) is not None


def run_summary(head: bytes) -> bool:
    """A trainer's ``train_summary.json``: a JSON object with the run's ``config`` (or its ``fingerprint``)."""
    return re.match(rb"^\s*\{", head) is not None and re.search(rb'"(config|fingerprint)"\s*:', head) is not None


def json_object_with(*keys: str) -> Callable[[bytes], bool]:
    """A JSON object holding one of ``keys`` near its start (a project JSON whose first keys are fixed)."""
    pattern = re.compile(rb'"(' + b"|".join(re.escape(k.encode()) for k in keys) + rb')"\s*:')

    def check(head: bytes) -> bool:
        return re.match(rb"^\s*\{", head) is not None and pattern.search(head) is not None

    return check


# Files the commands write *inside* an output directory under names no input file has: what each must look like to
# be replaced there (a file of that name that looks otherwise is the user's: `dpr.atomic.atomic_path` refuses it).
# Generic names (``test.json`` is a results file under ``bm25/`` but a training file in a dataset) are checked by
# the command that writes them, which names their kind (`dpr.atomic.check_outputs_inside`).
INSIDE: dict[str, tuple[Callable[[bytes], bool], str]] = {
    "README.md": (model_card, "a model card"),
    "metrics.jsonl": (metrics_rows, "a training metrics log"),
    "validation.jsonl": (metrics_rows, "a validation metrics log"),
    "train_summary.json": (run_summary, "a training summary"),
    "timings.json": (json_object_with("seconds"), "a pipeline timings JSON"),
    "report.json": (lambda head: re.match(rb'^\s*\{\s*"kind"\s*:\s*"(qa|qrels)"', head) is not None,
                    "an evaluation report (dpr-eval)"),
    "report.md": (lambda head: head.startswith(b"# Retrieval evaluation"), "an evaluation report (dpr-eval)"),
}


def foreign_inside(path: str | Path, kind: str | None = None) -> str | None:
    """None when the file at ``path`` may be replaced by the project's output of that name (an empty file, a name
    no command writes inside a directory, or a file of the kind the name stands for), else what it looks like.
    ``kind``: one of :data:`KINDS`, for a generic name (else the name's entry of :data:`INSIDE`)."""
    path = Path(path)
    kind = KINDS[kind] if kind is not None else INSIDE.get(path.name)
    if kind is None:
        return None
    with open(path, "rb") as f:
        head = f.read(HEAD)
    if not head.strip() or kind[0](head):
        return None
    return f"looks like {looks_like(head)}, not {kind[1]}"


def foreign(kinds: tuple[str, ...]) -> Callable[[Path], str | None]:
    """The ``same_kind`` check of `dpr.atomic.check_replaceable`: None when the file at the path is empty or one of
    ``kinds`` (an earlier output of the command), else ``"<what it looks like>, not <kinds>"``."""
    unknown = set(kinds) - KINDS.keys()
    if unknown:
        raise ValueError(f"unknown output kinds {sorted(unknown)}")

    def check(path: Path) -> str | None:
        with open(path, "rb") as f:
            head = f.read(HEAD)
        if not head.strip() or any(KINDS[k][0](head) for k in kinds):
            return None
        return f"looks like {looks_like(head)}, not {' or '.join(KINDS[k][1] for k in kinds)}"

    return check
