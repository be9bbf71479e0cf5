"""``train.corpus_sample``: the frozen-index phase and corpus negatives on a stated sub-corpus (seeded, holding every
passage the training file names), so what they build does not grow with the corpus; answers checked on the
retrieved candidates only; checkpoints without corpus vectors."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dpr.training.corpus_negatives import CorpusNegatives
from dpr.training.corpus_sample import sample_corpus
from dpr.training.masks import CorpusAnswers
from tests.conftest import TINY_PASSAGES
from tests.training.test_trainer import tiny_cfg


def _write_passages(path, n_extra: int, seed: int = 0, shuffle: bool = False) -> None:
    rows = [(pid, text, title) for pid, text, title in TINY_PASSAGES]
    rows += [(f"x{i}", f"filler passage number {i} about nothing in particular", f"Filler {i % 7}")
             for i in range(n_extra)]
    if shuffle:
        random.Random(seed).shuffle(rows)
    with open(path, "w", encoding="utf-8") as f:
        f.write("id\ttext\ttitle\n")
        for pid, text, title in rows:
            f.write(f"{pid}\t{text}\t{title}\n")


def test_the_sample_is_seeded_holds_the_named_passages_and_has_the_stated_size(tmp_path):
    keep = {"p1", "p5", "p8"}
    _write_passages(tmp_path / "a.tsv", 500)
    _write_passages(tmp_path / "b.tsv", 500, shuffle=True)  # the same passages in another order
    a = sample_corpus(tmp_path / "a.tsv", 40, seed=7, keep=keep)
    b = sample_corpus(tmp_path / "b.tsv", 40, seed=7, keep=keep)
    assert len(a.ids) == 40 and keep <= set(a.ids) and set(a.ids) == set(b.ids)
    assert a == sample_corpus(tmp_path / "a.tsv", 40, seed=7, keep=keep)  # same seed, same sample
    assert set(sample_corpus(tmp_path / "a.tsv", 40, seed=8, keep=keep).ids) != set(a.ids)
    assert a.positions == sorted(a.positions)  # file order; each row's text is the file's
    lines = (tmp_path / "a.tsv").read_text(encoding="utf-8").splitlines()[1:]
    assert all(lines[r].split("\t")[0] == pid for r, pid in zip(a.positions, a.ids))
    assert len(sample_corpus(tmp_path / "a.tsv", 2, seed=7, keep=keep).ids) == 3  # never fewer than the named ones


def test_frozen_phase_builds_the_same_size_at_two_corpus_sizes(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """At 300 and 3,000 passages the frozen-index phase encodes, searches and masks the same 24 passages."""
    import dpr.training.corpus_negatives as cn
    from dpr.trainkit import checkpoint as ckpt
    from dpr.training.train import train

    seen = []
    real_refresh = cn.CorpusNegatives.refresh

    def refresh(self, *a, **k):
        seen.append(len(self.texts))
        return real_refresh(self, *a, **k)

    answers_over = []
    real_answers = cn.CorpusAnswers.__init__

    def answers_init(self, texts):
        answers_over.append(len(texts))
        return real_answers(self, texts)

    monkeypatch.setattr(cn.CorpusNegatives, "refresh", refresh)
    monkeypatch.setattr(cn.CorpusAnswers, "__init__", answers_init)
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    for n in (300, 3000):
        _write_passages(passages, n - len(TINY_PASSAGES))
        out = tmp_path / f"run{n}"
        summary = train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=1, frozen_steps=2, corpus_sample=24,
                                 validate=False, save_every=1, keep_checkpoints=0, precision="fp32"))
        assert summary["steps"] == 3
        steps = sorted((out / ckpt.CHECKPOINT_DIR).glob("step_*"))
        assert len(steps) == 3
        for step_dir in steps:
            assert "corpus_vectors" not in ckpt.load_extra(step_dir)  # the corpus is never in a checkpoint
    assert seen == [24, 24] and answers_over == [24, 24]
    assert not list(passages.parent.glob("token_cache/passages.tsv.*"))  # no table of the whole corpus


def test_a_resumed_frozen_phase_re_encodes_its_sample_and_goes_on_as_if_uninterrupted(tiny_model_dir, tiny_data_dir,
                                                                                       tmp_path):
    import shutil

    from dpr.trainkit import checkpoint as ckpt
    from dpr.training.train import train

    _write_passages(tiny_data_dir / "tiny" / "passages.tsv", 100)
    kw = dict(max_steps=0, epochs=0, frozen_steps=4, corpus_sample=16, validate=False, precision="fp32",
              batch_size=2, hard_negatives=0, save_every=2, keep_checkpoints=0)
    whole = train(tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "whole", **kw))
    cut = tmp_path / "cut"
    train(tiny_cfg(tiny_model_dir, tiny_data_dir, cut, **kw))
    shutil.rmtree(cut / ckpt.CHECKPOINT_DIR / "step_4")  # as if killed after the checkpoint of step 2
    resumed = train(tiny_cfg(tiny_model_dir, tiny_data_dir, cut, **kw))
    assert resumed["resumed_from"].endswith("step_2") and resumed["steps"] == 4
    assert resumed["final_metrics"]["loss"] == pytest.approx(whole["final_metrics"]["loss"], abs=1e-6)


def test_top_k_candidates_are_checked_for_answers_without_scanning_the_corpus():
    rng = np.random.default_rng(0)
    texts = [f"passage {i} says {'honolulu' if i % 5 == 0 else 'nothing'} about {i}" for i in range(60)]
    ids = [f"d{i}" for i in range(60)]
    corpus = CorpusNegatives(ids, texts, [""] * 60, max_corpus=0, topk=7)  # FAISS top-k candidates
    corpus.set_vectors(torch.from_numpy(rng.standard_normal((60, 8)).astype(np.float32)), 0)
    questions = [{"question": "q", "positive_ids": frozenset({"d3"}), "answers": ["Honolulu"], "target_id": "d3"},
                 {"question": "r", "positive_ids": frozenset({"d10"}), "answers": [], "target_id": "d10"}]
    cands = corpus.extra(torch.from_numpy(rng.standard_normal((2, 8)).astype(np.float32)), questions)
    assert corpus._answers is None  # the whole corpus was never joined and searched
    answer_rows = set(CorpusAnswers(texts).rows(["Honolulu"]))
    cols = [c for c, pid in enumerate(cands.ids) if int(pid[1:]) in answer_rows]
    assert cols and cands.masks.ignore[0, cols].all()  # every answer-bearing candidate is ignored for question 0
    others = [c for c in range(len(cands.ids)) if c not in cols and cands.ids[c] != "d3"]
    assert not cands.masks.ignore[0, others].any() and not cands.masks.ignore[1].any()


def test_a_corpus_above_the_limit_is_sampled_without_the_key(tmp_path, monkeypatch):
    from dpr.training import corpus_sample

    _write_passages(tmp_path / "p.tsv", 92)
    assert corpus_sample.auto_sample_size(tmp_path / "p.tsv", limit=100) is None  # 100 passages: whole
    assert corpus_sample.auto_sample_size(tmp_path / "p.tsv", limit=99) == 99
