"""Topic-aware batches (``train.topic_batches``): a batch's questions share their positive's title."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from dpr.training.config import TrainConfig
from dpr.training.batch_order import global_batches, positive_topic
from tests.training.helpers import train_batches


def _ex(i: int, pos: str, title: str) -> dict:
    return {"question": f"q{i}", "answers": [], "negative_ctxs": [], "hard_negative_ctxs": [],
            "positive_ctxs": [{"passage_id": pos, "title": title, "text": f"text {pos}"}]}


def _articles(sizes: list[int]) -> list[dict]:
    """Questions of articles A0, A1, … (sizes[k] each, every one with its own positive passage), interleaved
    so that the file order says nothing about the topic."""
    examples: list[dict] = []
    for k, n in enumerate(sizes):
        examples += [_ex(len(examples), f"A{k}-p{j}", f"A{k}") for j in range(n)]
    return examples[::2] + examples[1::2]


def _topics_per_batch(examples: list[dict], batches: list[list[int]]) -> list[int]:
    return [len({positive_topic(examples[i]) for i in b}) for b in batches]


def test_batches_keep_to_one_topic_where_the_topics_are_big_enough():
    examples = _articles([8, 8, 8, 8])
    batches = global_batches(examples, 4, seed=1, epoch=0, topics=[positive_topic(e) for e in examples])
    assert sorted(i for b in batches for i in b) == list(range(32))  # every question, once
    assert _topics_per_batch(examples, batches) == [1] * 8
    plain = global_batches(examples, 4, seed=1, epoch=0)
    assert max(_topics_per_batch(examples, plain)) > 1  # the control: random batches mix the articles


def test_topic_batches_are_seeded_reshuffled_per_epoch_and_do_not_dwell_on_one_topic():
    examples = _articles([12, 12, 12])
    topics = [positive_topic(e) for e in examples]
    b0 = global_batches(examples, 4, seed=5, epoch=0, topics=topics)
    assert b0 == global_batches(examples, 4, seed=5, epoch=0, topics=topics)
    assert b0 != global_batches(examples, 4, seed=5, epoch=1, topics=topics)
    assert b0 != global_batches(examples, 4, seed=6, epoch=0, topics=topics)
    # over seeds, the batch order is shuffled: some run does not take an article's 3 batches in a row
    runs = []
    for seed in range(10):
        order = [positive_topic(examples[b[0]]) for b in global_batches(examples, 4, seed, 0, topics=topics)]
        runs.append(sum(a == b for a, b in zip(order, order[1:])))
    assert min(runs) < 6


def test_without_shuffle_the_topics_come_in_file_order_and_nothing_is_random():
    examples = [_ex(i, f"p{i}", t) for i, t in enumerate("BBBBAAAACCCC")]
    topics = [positive_topic(e) for e in examples]
    for seed in (0, 1):
        assert global_batches(examples, 4, seed, 0, shuffle=False, topics=topics) == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                                                     [8, 9, 10, 11]]


def test_without_titles_all_questions_are_one_topic_and_the_batches_are_the_plain_ones_reordered():
    examples = [_ex(i, f"p{i}", "") for i in range(20)]
    topical = global_batches(examples, 4, seed=2, epoch=0, topics=[positive_topic(e) for e in examples])
    assert sorted(topical) == sorted(global_batches(examples, 4, seed=2, epoch=0))


def test_positives_stay_deduplicated_within_a_topic():
    # one article whose 12 questions share 4 passages (3 each, SQuAD-like): a batch of 4 never repeats one
    examples = [_ex(i, f"p{i % 4}", "A") for i in range(12)] + [_ex(12 + i, f"b{i}", "B") for i in range(8)]
    batches = global_batches(examples, 4, seed=0, epoch=0, topics=[positive_topic(e) for e in examples])
    for b in batches:
        pos = [examples[i]["positive_ctxs"][0]["passage_id"] for i in b]
        assert len(set(pos)) == len(pos)
    assert len(batches) == 5


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6), batch=st.integers(1, 5), seed=st.integers(0, 99))
def test_a_topic_spans_at_most_its_share_of_batches_plus_one(sizes, batch, seed):
    """Without positive de-duplication a batch is a slice of the topic-grouped order, so a topic of n
    questions touches at most ceil(n / B) + 1 batches; every batch is full and no question repeats."""
    examples = _articles(sizes)
    topics = [positive_topic(e) for e in examples]
    batches = global_batches(examples, batch, seed, 0, dedup_positives=False, topics=topics)
    flat = [i for b in batches for i in b]
    assert len(flat) == len(set(flat)) == (len(examples) // batch) * batch
    assert all(len(b) == batch for b in batches)
    touched = Counter(t for b in batches for t in {topics[i] for i in b})
    for topic, n in Counter(topics).items():
        assert touched[topic] <= math.ceil(n / batch) + 1


def test_the_config_key_reaches_the_batches_and_ranks_split_the_same_global_batch():
    assert TrainConfig.from_dict({"topic_batches": True}).topic_batches is True
    assert TrainConfig().topic_batches is False
    examples = _articles([8, 8])
    kw = dict(hard_negatives=0, question_max_length=8, passage_max_length=8, seed=3, topic_batches=True)
    single = train_batches(examples, None, batch_size=4, **kw)
    ranks = [train_batches(examples, None, batch_size=2, rank=r, world_size=2, **kw) for r in range(2)]
    topic_of = {e["question"]: positive_topic(e) for e in examples}
    for b in range(single.num_batches(0)):
        together = [it.question for it in single.items(0, b)]
        assert together == [it.question for r in ranks for it in r.items(0, b)]
        assert len({topic_of[q] for q in together}) == 1
