"""nfcorpus: BEIR NFCorpus kept as qrels data (no answer strings).

- ``passages.tsv`` from corpus.jsonl (id = ``_id``). A document with an empty text but a title gets
  its title as text (never dropped: qrels may point at it); ``counts.empty_text_title_used`` says how
  many (0 in the published corpus).
- ``queries.jsonl`` (all splits) and ``qrels/{train,dev,test}.tsv``, validated against the corpus and
  query ids and rewritten with LF line endings.
- ``train.json`` / ``dev.json`` from the train / dev qrels: one example per query, positives = docs
  with relevance >= 1, most relevant first, ties in a seeded order, at most ``max_positives`` per query
  (null = all: NFCorpus has up to 1,363 per query and every ctx carries its text, so all of them would
  make a ~190 MB train.json; 16 gives ~45 MB); ``qrels`` holds every judged-relevant id with its grade,
  uncapped (the false-negative masks and dev nDCG@10 read it); ``answers`` is [] (qrels data). Test queries + qrels are the evaluation set.
"""

from __future__ import annotations

from pathlib import Path

from dpr.data.prepare.beir import write_beir_dataset

KIND = "qrels"
VERSION = 2  # 2: examples carry their uncapped ``qrels`` (see beir.py)
SOURCES = {
    "corpus": "nfcorpus-corpus",
    "queries": "nfcorpus-queries",
    "qrels_train": "nfcorpus-qrels-train",
    "qrels_dev": "nfcorpus-qrels-dev",
    "qrels_test": "nfcorpus-qrels-test",
}
DEFAULTS = {"seed": 13, "max_positives": 16}


def build(cfg: dict, files: dict[str, Path], out: Path) -> dict:
    # the generic BEIR recipe over the registry's files (nfcorpus has all three splits: nothing carved)
    return write_beir_dataset(files, out, int(cfg["seed"]), cfg.get("max_positives"))
