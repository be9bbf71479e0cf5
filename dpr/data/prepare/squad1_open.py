"""squad1_open: SQuAD v1.1 dev as an open-domain retrieval task.

- Corpus: every paragraph of every article cut into ``passage_words``-word passages (DPR's
  convention); title = article title with underscores as spaces. Passage id
  ``squad-<article_idx>-<paragraph_idx>-<chunk_idx>`` (0-based positions in the source file), so an
  id says where its text came from.
- Splits are by article (no article's questions in two splits): titles sorted, then shuffled with
  ``random.Random(seed)``; ~70/10/20 % train/dev/test (34/5/9 of the 48 articles).
- Train/dev questions get as positives the passages holding the start of each distinct answer span
  (first answer's passage first). A span straddling a chunk boundary goes to the chunk holding its
  start; ``counts.straddling_answers`` says how often that happened.
- Test (and dev) questions with all their answer strings (stripped, de-duplicated, order kept) go to
  ``test.qa.tsv`` / ``dev.qa.tsv``, evaluated against the whole corpus.
"""

from __future__ import annotations

from pathlib import Path

from tqdm.auto import tqdm

from dpr.data.chunking import chunk_of_span, chunk_words
from dpr.data.passages import write_passages
from dpr.data.prepare.common import check_fractions, dedup, seeded_split
from dpr.data.qa import QAPair, write_qa_tsv
from dpr.data.retriever_json import make_ctx, write_retriever_json
from dpr.data.squad import read_squad


KIND = "qa"
VERSION = 1
SOURCES = {"squad": "squad-dev-v1.1"}
DEFAULTS = {"seed": 13, "split": {"train": 0.7, "dev": 0.1, "test": 0.2}, "passage_words": 100}
SPLITS = ("train", "dev", "test")


def build(cfg: dict, files: dict[str, Path], out: Path) -> dict:
    articles = read_squad(files["squad"])
    fractions = check_fractions(cfg["split"], SPLITS, "data.split")
    titles = [a["title"] for a in articles]
    by_split = seeded_split(titles, fractions, int(cfg["seed"]))
    split_of = {t: s for s, ts in by_split.items() for t in ts}

    passages: list[tuple[str, str, str]] = []
    examples: dict[str, list[dict]] = {s: [] for s in SPLITS}
    qa_pairs: dict[str, list[QAPair]] = {s: [] for s in SPLITS}
    n_par = n_straddle = 0
    for a, art in enumerate(tqdm(articles, desc="squad1_open", unit="article", disable=None)):
        title = art["title"].replace("_", " ")
        split = split_of[art["title"]]
        for p, par in enumerate(art["paragraphs"]):
            n_par += 1
            chunks = chunk_words(par["context"], int(cfg["passage_words"]))
            ids = [f"squad-{a}-{p}-{c}" for c in range(len(chunks.texts))]
            passages.extend((pid, text, title) for pid, text in zip(ids, chunks.texts))
            for qa in par["qas"]:
                question = " ".join(qa["question"].split())
                answers = dedup([ans["text"] for ans in qa["answers"]])
                qa_pairs[split].append(QAPair(question, answers))
                if split == "test":
                    continue
                positives: list[int] = []
                for ans in qa["answers"]:
                    idx, whole = chunk_of_span(chunks, ans["answer_start"], ans["text"])
                    n_straddle += not whole
                    if idx not in positives:
                        positives.append(idx)
                examples[split].append({
                    "question": question,
                    "answers": answers,
                    "positive_ctxs": [make_ctx(ids[i], title, chunks.texts[i]) for i in positives],
                    "negative_ctxs": [],
                    "hard_negative_ctxs": [],
                })

    write_passages(out / "passages.tsv", passages)
    write_retriever_json(out / "train.json", examples["train"])
    write_retriever_json(out / "dev.json", examples["dev"])
    write_qa_tsv(out / "dev.qa.tsv", qa_pairs["dev"])
    write_qa_tsv(out / "test.qa.tsv", qa_pairs["test"])
    counts = {
        "articles": {s: len(by_split[s]) for s in SPLITS},
        "paragraphs": n_par,
        "passages": len(passages),
        "questions": {s: len(qa_pairs[s]) for s in SPLITS},
        "straddling_answers": n_straddle,
    }
    return {
        "counts": counts,
        "splits": {"test_articles": sorted(by_split["test"]), "dev_articles": sorted(by_split["dev"])},
        "notes": ["train/dev/test split by article; evaluate test.qa.tsv against the whole passages.tsv"],
    }
