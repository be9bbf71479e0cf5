"""nfcorpus: BEIR NFCorpus kept as qrels data (no answer strings).

- ``passages.tsv`` from corpus.jsonl (id = ``_id``). A document with an empty text but a title gets
  its title as text (never dropped: qrels may point at it); ``counts.empty_text_title_used`` says how
  many (0 in the published corpus).
- ``queries.jsonl`` (all splits) and ``qrels/{train,dev,test}.tsv``, validated against the corpus and
  query ids and rewritten with LF line endings.
- ``train.json`` / ``dev.json`` from the train / dev qrels: one example per query, positives = docs
  with relevance >= 1, most relevant first, ties in a seeded order, at most ``max_positives`` per query
  (null = all: NFCorpus has up to 1,363 per query and every ctx carries its text, so all of them would
  make a ~190 MB train.json; 16 gives ~45 MB); ``answers`` is [] (qrels data). Test queries + qrels are the evaluation set.
"""

from __future__ import annotations

import random
from pathlib import Path

from dpr.data.beir import iter_beir_corpus, read_qrels, read_queries, write_qrels, write_queries
from dpr.data.passages import write_passages
from dpr.data.retriever_json import make_ctx, write_retriever_json


KIND = "qrels"
VERSION = 1
SOURCES = {
    "corpus": "nfcorpus-corpus",
    "queries": "nfcorpus-queries",
    "qrels_train": "nfcorpus-qrels-train",
    "qrels_dev": "nfcorpus-qrels-dev",
    "qrels_test": "nfcorpus-qrels-test",
}
DEFAULTS = {"seed": 13, "max_positives": 16}
SPLITS = ("train", "dev", "test")


def _examples(qrels: dict, queries: dict, docs: dict, seed: int, cap: int | None) -> tuple[list[dict], int]:
    examples, dropped = [], 0
    for qid, rels in qrels.items():
        pos = [d for d, r in rels.items() if r >= 1]
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
        })
    return examples, dropped


def build(cfg: dict, files: dict[str, Path], out: Path) -> dict:
    docs: dict[str, tuple[str, str]] = {}
    title_as_text = 0
    for d in iter_beir_corpus(files["corpus"]):
        text = d["text"]
        if not text.strip():
            text, title_as_text = d["title"], title_as_text + 1
        docs[d["id"]] = (text, d["title"])
    queries = read_queries(files["queries"])
    qrels = {s: read_qrels(files[f"qrels_{s}"], query_ids=queries, doc_ids=docs) for s in SPLITS}

    cap = cfg.get("max_positives")
    seed = int(cfg["seed"])
    train_ex, dropped_train = _examples(qrels["train"], queries, docs, seed, cap)
    dev_ex, dropped_dev = _examples(qrels["dev"], queries, docs, seed, cap)

    write_passages(out / "passages.tsv", ((i, t, ti) for i, (t, ti) in docs.items()))
    write_queries(out / "queries.jsonl", queries)
    for s in SPLITS:
        write_qrels(out / "qrels" / f"{s}.tsv", qrels[s])
    write_retriever_json(out / "train.json", train_ex)
    write_retriever_json(out / "dev.json", dev_ex)
    counts = {
        "passages": len(docs),
        "queries": len(queries),
        "questions": {s: len(qrels[s]) for s in SPLITS},
        "qrels_pairs": {s: sum(len(v) for v in qrels[s].values()) for s in SPLITS},
        "examples": {"train": len(train_ex), "dev": len(dev_ex)},
        "positives_dropped_by_cap": {"train": dropped_train, "dev": dropped_dev},
        "empty_text_title_used": title_as_text,
    }
    return {"counts": counts, "notes": ["qrels data: evaluate queries.jsonl + qrels/test.tsv (no answer strings)"]}
