"""DPR's own datasets as recipes (``dpr_nq``, ``dpr_trivia``, ``dpr_squad1``: :func:`published_recipe`), and the
build they share. The fetching (downloads, the mirror, the user's own passages, the sha256 ledger) is
`dpr.data.prepare.dpr_files`.

- ``passages.tsv``: a symbolic link to ``psgs_w100.tsv`` where it was found (the cache, the mirror, or the
  user's ``data.passages``): 13 GB are not copied. Only its header is read here; every stage that reads the
  passages validates each line as it goes.
- ``train.json`` / ``dev.json``: DPR's biencoder files, streamed record by record (a multi-GB list is never
  held whole), answers stripped and de-duplicated, a ctx's ``psg_id`` renamed ``passage_id`` (some of DPR's
  files use one, some the other), every other key (``score``, ``title_score``, ``has_answer``) kept.
- ``dev.qa.tsv``: the dev file's questions with answers (what the pipeline tunes on); ``test.qa.tsv``: DPR's
  ``*-test.qa.csv`` (question, tab, a Python list of answers).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

from tqdm.auto import tqdm

from dpr.data._io import iter_json_array
from dpr.data.passages import HEADER
from dpr.data.prepare.common import dedup
from dpr.data.prepare.dpr_files import fetch_sources
from dpr.data.qa import QAPair, read_qa_tsv, write_qa_tsv
from dpr.data.retriever_json import CTX_LISTS, validate_example, write_retriever_json
from dpr.errors import DataError

KIND = "qa"
VERSION = 1


def published_recipe(dataset: str) -> SimpleNamespace:
    """The recipe of DPR's ``dataset`` (``nq``, ``trivia``, ``squad1``): its biencoder files and test questions
    against the 21M Wikipedia passages (``psgs_w100.tsv``), under the names DPR publishes them. Not in the
    registry (``SOURCES`` is empty): DPR publishes no digests, so `dpr.data.ledger` records them at first use,
    and where the files come from is not the dataset (``DEFAULTS`` is empty): their digests are."""
    roles = {"passages": "psgs_w100.tsv", "train": f"biencoder-{dataset}-train.json",
             "dev": f"biencoder-{dataset}-dev.json", "test": f"{dataset}-test.qa.csv"}

    def fetch(cfg: dict, mirror: str | Path | None, cache: str | Path) -> Any:
        return fetch_sources(cfg, roles, mirror, cache)

    return SimpleNamespace(KIND=KIND, VERSION=VERSION, SOURCES={}, DEFAULTS={}, ROLES=roles, build=build,
                           fetch_sources=fetch)


def link_passages(src: Path, dest: Path) -> None:
    """``dest`` → ``src`` (absolute; a hard link where symbolic ones are not possible), after checking
    ``src``'s header."""
    with open(src, "rb") as f:
        first = f.readline().decode("utf-8", errors="replace").rstrip("\r\n").lstrip("\ufeff")
    if tuple(h.strip() for h in first.split("\t")) != HEADER:
        raise DataError(src, f"expected header 'id<TAB>text<TAB>title', got {first[:80]!r}", line=1, field="header")
    try:
        os.symlink(src.resolve(), dest)
    except OSError as err:  # a file system without symbolic links: a hard link is no copy either
        try:
            os.link(src.resolve(), dest)
        except OSError:
            raise DataError(dest, f"cannot link to {src} ({err.strerror}): put data_dir on a file system with "
                            "links, or on the same one as the passages", field="passages") from None


def normalize_example(path: Path, ex: object, i: int) -> dict:
    """One DPR biencoder example in this project's retriever JSON (validated: errors name the record)."""
    if isinstance(ex, dict):
        ex = dict(ex)
        answers = ex.get("answers")
        if isinstance(answers, list) and all(isinstance(a, str) for a in answers):
            ex["answers"] = dedup(answers)
        for key in CTX_LISTS:
            ctxs = ex.get(key)
            if isinstance(ctxs, list):
                ex[key] = [_with_passage_id(c) for c in ctxs]
    return validate_example(path, ex, i)


def _with_passage_id(ctx: object) -> object:
    if isinstance(ctx, dict) and "passage_id" not in ctx and "psg_id" in ctx:
        ctx = dict(ctx)
        ctx["passage_id"] = ctx.pop("psg_id")
    return ctx


def convert_biencoder(src: Path, dest: Path, counts: dict, qa: list[QAPair] | None = None) -> int:
    """Stream ``src`` into ``dest``; fills ``counts`` (examples without a positive, hard negatives) and, when
    given, ``qa`` with each answered question."""
    no_positive = hard = 0

    def examples() -> Iterator[dict]:
        nonlocal no_positive, hard
        for i, raw in tqdm(iter_json_array(src), desc=src.name, unit=" questions", disable=None):
            ex = normalize_example(src, raw, i)
            no_positive += not ex["positive_ctxs"]
            hard += len(ex["hard_negative_ctxs"])
            if qa is not None and ex["answers"]:
                qa.append(QAPair(" ".join(ex["question"].split()), ex["answers"]))
            yield ex

    n = write_retriever_json(dest, examples())
    counts[dest.name] = {"questions": n, "without_positive": no_positive, "hard_negatives": hard}
    return n


def convert_qa(src: Path, dest: Path) -> int:
    pairs = [QAPair(" ".join(p.question.split()), dedup(p.answers)) for p in read_qa_tsv(src)]
    return write_qa_tsv(dest, pairs)


def build(cfg: dict, files: dict[str, Path], out: Path, sources: dict[str, dict] | None = None) -> dict:
    link_passages(files["passages"], out / "passages.tsv")
    detail: dict = {}
    dev_qa: list[QAPair] = []
    n_train = convert_biencoder(files["train"], out / "train.json", detail)
    convert_biencoder(files["dev"], out / "dev.json", detail, qa=dev_qa)
    write_qa_tsv(out / "dev.qa.tsv", dev_qa)
    n_test = convert_qa(files["test"], out / "test.qa.tsv")
    target = str(files["passages"].resolve())
    lines = next((s["lines"] for s in (sources or {}).values() if s.get("path") == target), None)
    return {
        "counts": {"passages": lines - 1 if lines else None,
                   "questions": {"train": n_train, "dev": len(dev_qa), "test": n_test}, **detail},
        "corpus": str(files["passages"].resolve()),
        "notes": [f"passages.tsv links to {files['passages'].resolve()} (read in place, not copied)",
                  "train/dev: DPR's biencoder files (its BM25 hard negatives included); test: DPR's test questions"],
    }
