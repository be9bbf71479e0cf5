"""import: a training set in a peer's format as a prepared dataset (qrels data).

``dpr-data data=import data.format=tevatron|flagembedding|sentence_transformers|triples
data.path=<file or folder> data.name=<name> data_dir=<dir>`` (``data.corpus=<collection>`` and
``data.queries=<qid TAB query file>`` for MS MARCO's id triples) writes ``<dir>/<name>/``:

- ``passages.tsv``: every passage the records name (or the whole collection); passages without ids get
  content ids, repeats are merged (``counts.duplicate_passages_merged``);
- ``train.json`` / ``dev.json``: one example per question (records of one question merged), its
  positives as ``positive_ctxs`` and as ``qrels`` (grade 1), the format's negatives as
  ``hard_negative_ctxs``, ``answers`` = [] (none of these formats has answer strings: the data is of
  kind ``qrels``, so training treats every positive as judged-relevant and picks weights by dev
  nDCG@10). The dev questions come from ``data.dev_path`` (or ``dev.*``/``validation.*`` in the
  folder), else a seeded ``dev_fraction`` of the training questions, as the BEIR recipe does;
- ``queries.jsonl`` and ``qrels/{train,dev}.tsv`` (what the BM25 miner reads to keep judged passages
  out of the negatives); no test split, unless ``data.test_fraction`` > 0 holds a seeded share of the
  training questions out as ``qrels/test.tsv`` (never trained on), so ``dpr-pipeline data=import …`` runs
  end to end and reports BM25, dense and hybrid on it;
- ``teacher_scores.imported.jsonl`` when the records carry teacher scores (`dpr.data.formats.scores`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping

from dpr.data.beir import write_qrels, write_queries
from dpr.data.formats import FORMATS
from dpr.data.formats.common import Collector
from dpr.data.formats.scores import FILE_NAME as SCORES_FILE, write_teacher_scores
from dpr.data.formats.triples import read_corpus, read_queries_tsv
from dpr.data.passages import write_passages
from dpr.data.prepare.common import seeded_split
from dpr.data.retriever_json import write_retriever_json
from dpr.errors import DataError

log = logging.getLogger(__name__)

KIND = "qrels"
VERSION = 1
SOURCES: dict[str, str] = {}  # the user's own files: see local_sources
DEFAULTS = {"format": None, "path": None, "corpus": None, "queries": None, "dev_path": None, "seed": 13,
            "dev_fraction": 0.1, "test_fraction": 0.0}
DEV_NAMES = ("dev", "validation")


def _format(cfg: Mapping):
    fmt = cfg.get("format")
    if fmt not in FORMATS:
        raise DataError("data config", f"data.format={fmt!r}: expected one of {', '.join(FORMATS)}", field="format")
    return FORMATS[fmt]


def _file(value: object, what: str) -> Path:
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file ({what})")
    return path


def local_sources(cfg: Mapping) -> dict[str, Path]:
    """``{role: file}``: ``train`` (data.path, or ``train.<ext>`` in that folder), ``dev`` if any, ``corpus``."""
    fmt = _format(cfg)
    if not cfg.get("path"):
        raise DataError("data config", "the import recipe needs data.path=<file or folder>", field="path")
    root = Path(str(cfg["path"])).expanduser()
    files: dict[str, Path] = {}
    if root.is_dir():
        found = {stem: root / f"{stem}{ext}" for stem in ("train", *DEV_NAMES) for ext in fmt.EXTENSIONS
                 if (root / f"{stem}{ext}").is_file()}
        if "train" not in found:
            raise FileNotFoundError(f"{root}: no train{'|'.join(fmt.EXTENSIONS)} in this folder")
        files["train"] = found["train"]
        dev = [found[n] for n in DEV_NAMES if n in found]
        if dev:
            files["dev"] = dev[0]
    else:
        files["train"] = _file(root, "data.path")
    if cfg.get("dev_path"):
        files["dev"] = _file(cfg["dev_path"], "data.dev_path")
    for key in ("corpus", "queries"):
        if cfg.get(key):
            if fmt is not FORMATS["triples"]:
                raise DataError("data config", f"data.{key} is for the triples format, not {cfg['format']}", field=key)
            files[key] = _file(cfg[key], f"data.{key}")
    return files


def collect(fmt_name: str, files: Mapping[str, Path]) -> Collector:
    """Read the files of one import into a `Collector` (the collection first, then train, then dev)."""
    fmt = FORMATS[fmt_name]
    col = Collector()
    corpus = None
    if "corpus" in files:
        read_corpus(files["corpus"], col)
        corpus = col.passages
    extra = {"queries": read_queries_tsv(files["queries"])} if "queries" in files else {}
    for split in ("train", "dev"):
        if split in files:
            fmt.read(files[split], col, split=split, corpus=corpus, **extra)
    return col


def carve_dev(col: Collector, seed: int, dev_fraction: float, split: str = "dev") -> int:
    """Move a seeded share of the training questions to ``split`` (the BEIR recipe's rule); returns how many."""
    key = f"{split}_fraction"
    if not 0.0 < float(dev_fraction) < 1.0:
        raise DataError("data config", f"{key} must lie in (0, 1), got {dev_fraction!r}", field=key)
    train = [qid for qid, q in col.questions.items() if q["split"] == "train"]
    carved = seeded_split(train, {split: float(dev_fraction), "train": 1 - float(dev_fraction)}, seed)
    for qid in carved[split]:
        col.questions[qid]["split"] = split
    return len(carved[split])


def build(cfg: dict, files: dict[str, Path], out: Path) -> dict:
    col = collect(cfg["format"], files)
    if not col.questions:  # an empty file would make a dataset of nothing that later steps take for data
        raise DataError(files["train"], f"no records to import (the file is empty, or holds only blank lines); "
                        f"check data.path=", field="path")
    notes = [f"imported from {cfg['format']} ({files['train']}); qrels data: positives are the judgements, "
             "the format's negatives are hard_negative_ctxs; no test split"]
    if "dev" not in files:
        n = carve_dev(col, int(cfg["seed"]), float(cfg["dev_fraction"]))
        notes.append(f"no dev file: {n} of the training questions (seed {cfg['seed']}) became dev")
    test_fraction = float(cfg.get("test_fraction") or 0.0)
    if test_fraction:  # held out after dev is settled: a question is in one split only
        n = carve_dev(col, int(cfg["seed"]) + 1, test_fraction, split="test")
        notes.append(f"data.test_fraction: {n} of the training questions (seed {int(cfg['seed']) + 1}) are the test split")
    examples = {s: col.examples(s) for s in ("train", "dev")}
    test = col.examples("test") if test_fraction else []
    write_passages(out / "passages.tsv", col.passage_rows())
    for split, exs in examples.items():
        write_retriever_json(out / f"{split}.json", exs)
        write_qrels(out / "qrels" / f"{split}.tsv", {ex["query_id"]: ex["qrels"] for ex in exs})
    if test:
        write_qrels(out / "qrels" / "test.tsv", {ex["query_id"]: ex["qrels"] for ex in test})
    write_queries(out / "queries.jsonl", {ex["query_id"]: ex["question"] for exs in (*examples.values(), test)
                                          for ex in exs})
    scored = col.teacher_scores()
    if scored:
        write_teacher_scores(out / SCORES_FILE, scored)
    prompts = {ex.get("prompt") for exs in examples.values() for ex in exs}
    if len(prompts) == 1 and None not in prompts:
        notes.append(f"every question has the prompt {prompts.pop()!r}: train with model.question_prefix set to it")
    counts = {
        **col.counts,
        "negatives_dropped_as_positive": col.dropped_negatives(),
        "passages": len(col.passages),
        "questions": {**{s: len(exs) for s, exs in examples.items()}, **({"test": len(test)} if test else {})},
        "hard_negatives": {s: sum(len(ex["hard_negative_ctxs"]) for ex in exs) for s, exs in examples.items()},
        "teacher_scored_questions": len(scored),
        "teacher_scores": sum(len(s["scores"]) for s in scored),
    }
    log.info("import: %d records → %d questions (%d merged), %d passages (%d repeats merged), %d teacher scores",
             counts["records"], len(col.questions), counts["questions_merged"], counts["passages"],
             counts["duplicate_passages_merged"], counts["teacher_scores"])
    return {"counts": counts, "notes": notes, "format": cfg["format"]}
