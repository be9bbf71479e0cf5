"""Gold passages of a split's questions, for reading comprehension ("the reader given the right passage").

- ``train``/``dev``: the ``positive_ctxs`` of ``<split>.json``.
- squad1_open ``test``: the recipe keeps no test positives, so they are rebuilt from the SQuAD source
  exactly as the recipe chunks it (same split seed, same passages): each answer span's passage.
  The rebuilt questions are checked against ``test.qa.tsv`` one by one.
- otherwise, only when a results file is given: pseudo-gold, the first retrieved passage holding an
  answer (``has_answer``), else the top-1 (said so in the returned description).

Records are ``{question, answers, ctxs: [{title, text}]}``, the shape open-domain reading uses.
"""

from __future__ import annotations

from pathlib import Path

from dpr.data.dataset import DatasetPaths
from dpr.data.qa import read_qa_tsv
from dpr.data.retriever_json import read_retriever_json
from dpr.errors import DataError
from dpr.eval.has_answer import has_answer


def gold_records(ds: DatasetPaths, split: str, results: str | Path | None = None) -> tuple[list[dict], str]:
    """``(records, how the gold passages were found)`` for ``split`` of the dataset ``ds``."""
    json_path = ds.root / f"{split}.json"
    if json_path.is_file():
        recs = [{"question": r["question"], "answers": r["answers"], "ctxs": r["positive_ctxs"]}
                for r in read_retriever_json(json_path) if r["answers"]]
        return recs, f"positive_ctxs of {json_path}"
    meta = ds.read_meta()
    if meta.get("recipe") == "squad1_open" and split == "test":
        return _squad1_open_test(ds, meta), "SQuAD source paragraphs rebuilt as the squad1_open recipe chunks them"
    if results is not None:
        from dpr.data.results import read_results

        recs = []
        for r in read_results(results):
            hit = next((c for c in r["ctxs"] if has_answer(r["answers"], c["text"])), r["ctxs"][0] if r["ctxs"] else None)
            recs.append({"question": r["question"], "answers": r["answers"], "ctxs": [hit] if hit else []})
        return recs, f"pseudo-gold: first passage with an answer in {results} (top-1 when none)"
    raise FileNotFoundError(f"{json_path}: no gold passages for split {split!r} (and no results file to fall back on)")


def _squad1_open_test(ds: DatasetPaths, meta: dict) -> list[dict]:
    from dpr.data.chunking import chunk_of_span, chunk_words
    from dpr.data.prepare import squad1_open
    from dpr.data.prepare.common import dedup, seeded_split
    from dpr.data.sources import default_mirror_dir, fetch
    from dpr.data.squad import read_squad

    cfg = {**squad1_open.DEFAULTS, **meta.get("config", {})}
    articles = read_squad(fetch(squad1_open.SOURCES["squad"], mirror_dir=default_mirror_dir()))
    test_titles = set(seeded_split([a["title"] for a in articles], cfg["split"], int(cfg["seed"]))["test"])
    records = []
    for art in articles:
        if art["title"] not in test_titles:
            continue
        title = art["title"].replace("_", " ")
        for par in art["paragraphs"]:
            chunks = chunk_words(par["context"], int(cfg["passage_words"]))
            for qa in par["qas"]:
                idx = dedup_ints(chunk_of_span(chunks, a["answer_start"], a["text"])[0] for a in qa["answers"])
                records.append({"question": " ".join(qa["question"].split()),
                                "answers": dedup([a["text"] for a in qa["answers"]]),
                                "ctxs": [{"title": title, "text": chunks.texts[i]} for i in idx]})
    expected = read_qa_tsv(ds.qa("test"))
    if len(expected) != len(records):
        raise DataError(ds.qa("test"), f"{len(expected)} questions, but the SQuAD source gives {len(records)} "
                                       "test questions: the dataset was prepared from other data")
    for i, (rec, qa) in enumerate(zip(records, expected)):
        if rec["question"] != qa.question or rec["answers"] != list(qa.answers):
            raise DataError(ds.qa("test"), f"question {qa.question!r} differs from the SQuAD source's "
                                           f"{rec['question']!r}", line=i + 1, field="question")
    return records


def dedup_ints(values) -> list[int]:
    out: list[int] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out
