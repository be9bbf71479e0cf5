"""False-negative masks from real batches, whole-corpus answer search, and the frozen-index candidates."""

from __future__ import annotations

import torch

from dpr.eval.has_answer import has_answer
from dpr.losses import PairMasks, SoftmaxNLLLoss
from dpr.training.corpus_negatives import CorpusNegatives
from dpr.training.batching import TrainItem
from dpr.training.masks import CorpusAnswers, pair_masks
from dpr.training.steps import bind_loss


class _NoScale:
    def scale(self, x):
        return x


def ctx(pid: str, text: str) -> dict:
    return {"passage_id": pid, "title": "", "text": text}


def q(positive_ids, answers=(), target=None) -> dict:
    ids = frozenset(positive_ids)
    return {"positive_ids": ids, "answers": list(answers), "target_id": target or sorted(ids)[0]}


def test_answer_bearing_passages_are_ignored_and_nothing_else():
    ids = ["a", "b", "c", "d"]
    texts = ["Paris is in France.", "Berlin is big.", "Lyon and Paris are French cities.", "Nothing here."]
    m = pair_masks([q({"a"}, ["Paris"]), q({"b"}, ["Berlin"])], ids, texts, [0, 1])
    assert m.positive.tolist() == [[True, False, False, False], [False, True, False, False]]
    # "c" holds Paris: a false negative for question 0 only
    assert m.ignore.tolist() == [[False, False, True, False], [False, False, False, False]]
    off = pair_masks([q({"a"}, ["Paris"]), q({"b"}, ["Berlin"])], ids, texts, [0, 1], mask_answers=False)
    assert not off.ignore.any()


def test_other_positives_are_positives_or_ignored_whoever_brought_them():
    ids = ["d1", "x", "d2", "y", "d1"]  # d2 came in as question 1's positive, d1 again as a negative
    qs = [q({"d1", "d2"}, target="d1"), q({"d2"}, target="d2")]
    single = pair_masks(qs, ids, None, [0, 2], mask_answers=False)
    assert single.positive.tolist() == [[True, False, False, False, False], [False, False, True, False, False]]
    assert single.ignore.tolist() == [[False, False, True, False, True], [False] * 5]
    multi = pair_masks(qs, ids, None, [0, 2], multi_positive=True, mask_answers=False)
    # d2 is a second positive of question 0; the second copy of d1 is still ignored (one passage, one vote)
    assert multi.positive.tolist() == [[True, False, True, False, False], [False, False, True, False, False]]
    assert multi.ignore.tolist() == [[False, False, False, False, True], [False] * 5]


def test_judged_documents_past_the_positives_cap_are_never_negatives():
    from dpr.training.batching import make_item

    # qrels data: positive_ctxs holds d1 only (capped); qrels also judges d2 relevant, d3 not (grade 0)
    ex = {"question": "q", "answers": [], "positive_ctxs": [ctx("d1", "one")], "negative_ctxs": [],
          "hard_negative_ctxs": [ctx("n1", "neg")], "qrels": {"d1": 1, "d2": 2, "d3": 0}}
    item = make_item(ex, 0, 0, 0, hard_negatives=1)
    assert item.positive_ids == {"d1", "d2"}
    ids = ["d1", "n1", "d2", "d3"]
    single = pair_masks([item.as_question()], ids, None, [0], mask_answers=False)
    assert single.positive.tolist() == [[True, False, False, False]]
    assert single.ignore.tolist() == [[False, False, True, False]]  # d2 leaves the denominator, d3 stays
    multi = pair_masks([item.as_question()], ids, None, [0], multi_positive=True, mask_answers=False)
    assert multi.positive.tolist() == [[True, False, True, False]] and not multi.ignore.any()


def test_corpus_answers_equals_has_answer_everywhere():
    texts = ["The Eiffel Tower is in Paris.", "Paris Hilton", "paris!", "Parisian food", "In 1,000 years", "x"]
    found = CorpusAnswers(texts)
    for answers in (["Paris"], ["1,000"], ["1000"], ["Eiffel Tower", "food"], ["", " "], ["is in Paris"]):
        assert found.rows(answers) == [j for j, t in enumerate(texts) if has_answer(answers, t)]


def _batch(items, per_q):
    from dpr.training.batching import Batch

    ctxs = [c for it in items for c in it.passages]
    m = pair_masks([it.as_question() for it in items], [c["passage_id"] for c in ctxs], [c["text"] for c in ctxs],
                   [i * per_q for i in range(len(items))])
    return Batch(0, {}, {}, m, [it.as_question() for it in items])


def _sim(a, b):
    return a @ b.T / 0.5


def test_frozen_index_over_exactly_the_batch_equals_the_in_batch_loss():
    torch.manual_seed(0)
    items = [TrainItem(f"q{i}", [ctx(f"p{i}", f"text {i}")], (f"answer{i}",), frozenset({f"p{i}"})) for i in range(4)]
    qv, pv = torch.randn(4, 8), torch.randn(4, 8)
    batch = _batch(items, 1)
    out: list = []
    in_batch = bind_loss(SoftmaxNLLLoss(), _sim, batch, corpus=None, frozen=False, accum=1, scaler=_NoScale(),
                         outputs=out)(qv, pv)
    corpus = CorpusNegatives([f"p{i}" for i in range(4)], [f"text {i}" for i in range(4)], [""] * 4)
    corpus.set_vectors(pv, step=0)
    frozen = bind_loss(SoftmaxNLLLoss(), _sim, batch, corpus=corpus, frozen=True, accum=1, scaler=_NoScale(),
                       outputs=out)(qv, None)
    torch.testing.assert_close(frozen.loss, in_batch.loss, rtol=1e-6, atol=1e-7)
    assert frozen.num_candidates == in_batch.num_candidates == 4


def test_corpus_candidates_target_the_cached_positive_and_ignore_answers():
    items = [TrainItem("q0", [ctx("p0", "alpha")], ("beta",), frozenset({"p0"})),
             TrainItem("q1", [ctx("p1", "gamma")], ("delta",), frozenset({"p1"}))]
    corpus = CorpusNegatives(["p0", "p1", "p2", "p3"], ["alpha", "gamma", "beta here", "other"], [""] * 4)
    corpus.set_vectors(torch.randn(4, 3), step=0)
    vecs, ids, m, targets = corpus.extra(torch.randn(2, 3), [it.as_question() for it in items])
    assert ids == ["p0", "p1", "p2", "p3"] and vecs.shape == (4, 3) and targets == [0, 1]
    assert m.positive.tolist() == [[True, False, False, False], [False, True, False, False]]
    assert m.ignore.tolist() == [[False, False, True, False], [False, False, False, False]]  # p2 holds q0's answer


def test_two_tower_step_with_corpus_adds_a_corpus_term():
    torch.manual_seed(0)
    items = [TrainItem(f"q{i}", [ctx(f"p{i}", f"text {i}")], (), frozenset({f"p{i}"})) for i in range(3)]
    qv, pv, cached = torch.randn(3, 8), torch.randn(3, 8), torch.randn(5, 8)
    batch = _batch(items, 1)
    corpus = CorpusNegatives([f"p{i}" for i in range(5)], [f"text {i}" for i in range(5)], [""] * 5)
    corpus.set_vectors(cached, step=0)
    out: list = []
    both = bind_loss(SoftmaxNLLLoss(), _sim, batch, corpus=corpus, frozen=False, accum=1, scaler=_NoScale(),
                     outputs=out)(qv, pv)
    in_batch = SoftmaxNLLLoss()(qv, pv, batch.masks, _sim)
    whole = SoftmaxNLLLoss()(qv, cached, PairMasks.dpr_layout(3, 1, num_candidates=5), _sim)
    torch.testing.assert_close(both.loss, in_batch.loss + whole.loss)
    assert both.num_candidates == 8


def test_topk_candidates_always_hold_the_positives():
    torch.manual_seed(0)
    n = 50
    corpus = CorpusNegatives([f"p{i}" for i in range(n)], [f"t{i}" for i in range(n)], [""] * n,
                             max_corpus=10, topk=5, mask_answers=False)
    corpus.set_vectors(torch.nn.functional.normalize(torch.randn(n, 4), dim=1), step=0)
    qv = torch.randn(2, 4)
    vecs, ids, m, targets = corpus.extra(qv, [q({"p7"}), q({"p33"})])
    assert "p7" in ids and "p33" in ids and len(ids) <= 12
    assert [ids[t] for t in targets] == ["p7", "p33"]
    m.validate(2, len(ids))
    assert isinstance(m, PairMasks)
