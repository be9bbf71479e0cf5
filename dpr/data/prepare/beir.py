"""beir: any BEIR-format folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``) as qrels data.

``dpr-data data=beir data.path=<folder> data_dir=<dir>`` prepares ``<dir>/<folder's name>/`` in the
layout of the nfcorpus recipe (which is this recipe over registry files):

- ``passages.tsv`` from corpus.jsonl (a document with an empty text but a title gets its title as text,
  never dropped: qrels may point at it), ``queries.jsonl`` (all splits) and ``qrels/<split>.tsv``,
  validated against the corpus and query ids and rewritten with LF line endings;
- the splits are the folder's qrels files among train / dev / test (``validation.tsv`` counts as dev);
  ``test`` is required (it is what is evaluated). With train but no dev, a seeded ``dev_fraction`` of
  the train queries becomes dev (their qrels move to ``qrels/dev.tsv``); with no train there is no
  training data (``train.json`` / ``dev.json`` are empty: BM25 and untrained dense only);
- ``train.json`` / ``dev.json``: one example per query, positives = docs with relevance >= 1, most
  relevant first, ties in a seeded order, at most ``max_positives`` per query (their texts are what
  training reads); ``qrels`` = every judged-relevant doc of the query with its grade, uncapped (what the
  false-negative masks and dev nDCG@10 read: a relevant doc past the cap is never a negative);
  ``answers`` is [].
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Mapping

from dpr.data.beir import iter_beir_corpus, read_qrels, read_queries, write_qrels, write_queries
from dpr.data.passages import write_passages
from dpr.data.prepare.common import seeded_split
from dpr.data.retriever_json import make_ctx, write_retriever_json
from dpr.errors import DataError

KIND = "qrels"
VERSION = 2  # 2: examples carry their uncapped ``qrels``
SOURCES: dict[str, str] = {}  # local files: see local_sources
DEFAULTS = {"path": None, "seed": 13, "max_positives": 16, "dev_fraction": 0.1}
SPLITS = ("train", "dev", "test")
SPLIT_FILES = {"train": ("train.tsv",), "dev": ("dev.tsv", "validation.tsv"), "test": ("test.tsv",)}


def local_sources(cfg: Mapping) -> dict[str, Path]:
    """``{role: file}`` of the BEIR folder ``cfg["path"]``: corpus, queries and each split's qrels."""
    if not cfg.get("path"):
        raise DataError("data config", "the beir recipe needs data.path=<BEIR folder>", field="path")
    root = Path(str(cfg["path"])).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such BEIR folder")
    files = {"corpus": root / "corpus.jsonl", "queries": root / "queries.jsonl"}
    for role, f in files.items():
        if not f.is_file():
            raise FileNotFoundError(f"{f}: missing ({role}; a BEIR folder has corpus.jsonl, queries.jsonl, qrels/)")
    for split, names in SPLIT_FILES.items():
        found = [root / "qrels" / n for n in names if (root / "qrels" / n).is_file()]
        if found:
            files[f"qrels_{split}"] = found[0]
    if "qrels_test" not in files:
        raise FileNotFoundError(f"{root / 'qrels' / 'test.tsv'}: missing (the test split is what is evaluated)")
    return files


def positive_examples(qrels: Mapping[str, Mapping[str, int]], queries: Mapping[str, str],
                      docs: Mapping[str, tuple[str, str]], seed: int, cap: int | None) -> tuple[list[dict], int]:
    """Retriever-JSON examples from qrels (positives: relevance >= 1, most relevant first, ties seeded);
    returns them and how many positives the cap dropped."""
    examples, dropped = [], 0
    for qid, rels in qrels.items():
        pos = [d for d, r in rels.items() if r >= 1]
        judged = {d: int(rels[d]) for d in sorted(pos)}
        # string seeding of random.Random hashes with sha512: stable across machines (unlike hash())
        random.Random(f"{seed}:{qid}").shuffle(pos)
        pos.sort(key=lambda d: -rels[d])  # stable: the seeded order breaks ties
        if cap is not None and len(pos) > cap:
            dropped += len(pos) - cap
            pos = pos[:cap]
        if not pos:
            continue
        examples.append({
            "question": queries[qid],
            "answers": [],
            "positive_ctxs": [make_ctx(d, docs[d][1], docs[d][0]) for d in pos],
            "negative_ctxs": [],
            "hard_negative_ctxs": [],
            "query_id": qid,
            "qrels": judged,
        })
    return examples, dropped


def read_corpus(path: Path) -> tuple[dict[str, tuple[str, str]], int]:
    """``{doc id: (text, title)}`` and how many empty texts were replaced by their title."""
    docs: dict[str, tuple[str, str]] = {}
    title_as_text = 0
    for d in iter_beir_corpus(path):
        text = d["text"]
        if not text.strip():
            text, title_as_text = d["title"], title_as_text + 1
        docs[d["id"]] = (text, d["title"])
    return docs, title_as_text


def write_beir_dataset(files: Mapping[str, Path], out: Path, seed: int, cap: int | None,
                       dev_fraction: float = 0.1) -> dict:
    """Validate and write a qrels dataset from BEIR files (``corpus``, ``queries``, ``qrels_<split>``);
    returns the recipe result (counts, notes)."""
    docs, title_as_text = read_corpus(files["corpus"])
    queries = read_queries(files["queries"])
    qrels = {s: read_qrels(files[f"qrels_{s}"], query_ids=queries, doc_ids=docs)
             for s in SPLITS if f"qrels_{s}" in files}
    notes = ["qrels data: evaluate queries.jsonl + qrels/test.tsv (no answer strings)"]
    if "dev" not in qrels and "train" in qrels:
        if not 0.0 < float(dev_fraction) < 1.0:
            raise DataError("data config", f"dev_fraction must lie in (0, 1), got {dev_fraction!r}", field="dev_fraction")
        carved = seeded_split(list(qrels["train"]), {"dev": float(dev_fraction), "train": 1 - float(dev_fraction)}, seed)
        qrels["dev"] = {q: qrels["train"][q] for q in carved["dev"]}
        qrels["train"] = {q: qrels["train"][q] for q in qrels["train"] if q not in qrels["dev"]}
        notes.append(f"no dev qrels: {len(qrels['dev'])} of the train queries (seed {seed}) became dev")
    if "train" not in qrels:
        notes.append("no train qrels: no training data (train.json and dev.json are empty)")
    train_ex, dropped_train = positive_examples(qrels.get("train", {}), queries, docs, seed, cap)
    dev_ex, dropped_dev = positive_examples(qrels.get("dev", {}), queries, docs, seed, cap)

    write_passages(out / "passages.tsv", ((i, t, ti) for i, (t, ti) in docs.items()))
    write_queries(out / "queries.jsonl", queries)
    for s, split_qrels in qrels.items():
        write_qrels(out / "qrels" / f"{s}.tsv", split_qrels)
    write_retriever_json(out / "train.json", train_ex)
    write_retriever_json(out / "dev.json", dev_ex)
    counts = {
        "passages": len(docs),
        "queries": len(queries),
        "questions": {s: len(q) for s, q in qrels.items()},
        "qrels_pairs": {s: sum(len(v) for v in q.values()) for s, q in qrels.items()},
        "examples": {"train": len(train_ex), "dev": len(dev_ex)},
        "positives_dropped_by_cap": {"train": dropped_train, "dev": dropped_dev},
        "empty_text_title_used": title_as_text,
    }
    return {"counts": counts, "notes": notes}


def build(cfg: dict, files: dict[str, Path], out: Path) -> dict:
    return write_beir_dataset(files, out, int(cfg["seed"]), cfg.get("max_positives"),
                              float(cfg.get("dev_fraction", 0.1)))
