"""sciq_open: SciQ as an open-domain retrieval task.

- Corpus: the ``support`` paragraphs of the train and valid files, stripped, empty ones left out,
  de-duplicated by exact text; one passage per support (not cut into 100-word chunks: a support is one
  textbook paragraph, median 55 words, and the question was written from all of it). Empty title.
  Passage id ``sciq-<n>`` in first-seen order (train file, then valid file).
- Train: train questions whose support is non-empty (answers = [correct_answer], positive = the
  support's passage). A dev split (``dev_fraction``) is carved from them *by support passage* with
  ``random.Random(seed)``, so no dev question shares its positive with a train question.
- Test: all valid questions, including those without a support (they are still answerable from the
  corpus or not: that is the task), to ``test.qa.tsv``; dev questions also to ``dev.qa.tsv``.
- Train/test overlap is removed from train and dev (never from test): a training question with the
  same question and answer as a test question (7 in SciQ), and any training question whose positive
  is the support of a test question. ``meta.json`` counts both (``removed_test_overlap``).
"""

from __future__ import annotations

from pathlib import Path

from dpr.data.passages import write_passages
from dpr.data.prepare.common import check_fractions, seeded_split
from dpr.data.qa import QAPair, write_qa_tsv
from dpr.data.retriever_json import make_ctx, write_retriever_json
from dpr.data.sciq import read_sciq


KIND = "qa"
VERSION = 2  # 2: train/test overlap removed from training
SOURCES = {"train": "sciq-train", "valid": "sciq-valid"}
DEFAULTS = {"seed": 13, "dev_fraction": 0.1}


def build(cfg: dict, files: dict[str, Path], out: Path) -> dict:
    train = read_sciq(files["train"])
    valid = read_sciq(files["valid"])
    pid_of: dict[str, str] = {}
    for item in train + valid:
        support = item["support"].strip()
        if support and support not in pid_of:
            pid_of[support] = f"sciq-{len(pid_of)}"
    n_supports = sum(1 for item in train + valid if item["support"].strip())

    def qa_key(item: dict) -> tuple[str, str]:
        return " ".join(item["question"].lower().split()), " ".join(item["correct_answer"].lower().split())

    test_qa = {qa_key(it) for it in valid}
    train_qa = {qa_key(it) for it in train}
    test_supports = {it["support"].strip() for it in valid if it["support"].strip()}
    with_support = [item for item in train if item["support"].strip()]
    same_qa = [it for it in with_support if qa_key(it) in test_qa]
    shared = [it for it in with_support if it["support"].strip() in test_supports and qa_key(it) not in test_qa]
    dropped = {id(it) for it in same_qa + shared}
    eligible = [item for item in with_support if id(item) not in dropped]
    train_pids = sorted({pid_of[item["support"].strip()] for item in eligible})
    dev_frac = float(cfg["dev_fraction"])
    check_fractions({"dev": dev_frac, "train": 1.0 - dev_frac}, ("dev", "train"), "data.dev_fraction")
    dev_pids = set(seeded_split(train_pids, {"dev": dev_frac, "train": 1.0 - dev_frac}, int(cfg["seed"]))["dev"])

    def example(item: dict) -> dict:
        support = item["support"].strip()
        return {
            "question": item["question"].strip(),
            "answers": [item["correct_answer"].strip()],
            "positive_ctxs": [make_ctx(pid_of[support], "", support)],
            "negative_ctxs": [],
            "hard_negative_ctxs": [],
        }

    train_ex = [example(it) for it in eligible if pid_of[it["support"].strip()] not in dev_pids]
    dev_ex = [example(it) for it in eligible if pid_of[it["support"].strip()] in dev_pids]
    test = [QAPair(it["question"].strip(), [it["correct_answer"].strip()]) for it in valid]

    write_passages(out / "passages.tsv", ((pid, text, "") for text, pid in pid_of.items()))
    write_retriever_json(out / "train.json", train_ex)
    write_retriever_json(out / "dev.json", dev_ex)
    write_qa_tsv(out / "dev.qa.tsv", [QAPair(e["question"], e["answers"]) for e in dev_ex])
    write_qa_tsv(out / "test.qa.tsv", test)
    counts = {
        "passages": len(pid_of),
        "duplicate_supports_merged": n_supports - len(pid_of),
        "questions": {"train": len(train_ex), "dev": len(dev_ex), "test": len(test)},
        "train_without_support_skipped": len(train) - len(with_support),
        # training examples removed; "test_questions_in_train" counts the test side (some of those training
        # twins had no support and were never eligible for training anyway)
        "removed_test_overlap": {"same_question_and_answer": len(same_qa), "positive_is_a_test_support": len(shared),
                                 "test_questions_in_train": sum(1 for it in valid if qa_key(it) in train_qa)},
        "test_without_support": sum(1 for it in valid if not it["support"].strip()),
    }
    return {"counts": counts, "notes": ["test = SciQ valid split (the official test split is held out)"]}
