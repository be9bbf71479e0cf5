"""The seeded order of training examples and their global batches, sharded per rank under DDP (see
`dpr.training.batching` for what a batch is): each epoch a permutation seeded by ``(seed, epoch)``, optionally
grouped by the positive passage's title (``topic_batches``), filled so no batch holds one positive twice, the last
incomplete global batch dropped, and rank ``r`` taking slice ``[r·B, (r+1)·B)`` of each."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def seeded_rng(seed: int, *keys: int) -> np.random.Generator:
    # SeedSequence mixes all keys: (seed, epoch=1, idx=0) and (seed, epoch=0, idx=1) are unrelated streams.
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, *(int(k) for k in keys)])


def epoch_permutation(num_examples: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The order of examples in ``epoch`` (identity when ``shuffle`` is off)."""
    if not shuffle:
        return np.arange(num_examples)
    return seeded_rng(seed, epoch).permutation(num_examples)


def positive_topic(example: dict) -> str:
    """What a topic-aware batch groups by: the title of the question's first positive passage (its
    Wikipedia article in SQuAD and NQ; "" where passages have no titles, so all of them are one topic)."""
    return str(example["positive_ctxs"][0].get("title") or "")


def _positive_ids(example: dict) -> frozenset[str]:
    return frozenset(c["passage_id"] for c in example["positive_ctxs"])


def positive_id_sets(examples: Sequence[dict]) -> Sequence[frozenset[str]]:
    """Each example's positive ids (an ExampleFile keeps them from its scan: nothing is parsed)."""
    kept = getattr(examples, "positive_ids", None)
    return kept if kept is not None else [_positive_ids(ex) for ex in examples]


def example_topics(examples: Sequence[dict]) -> list[str]:
    """Each example's :func:`positive_topic` (kept by an ExampleFile's scan)."""
    kept = getattr(examples, "topics", None)
    return list(kept) if kept is not None else [positive_topic(ex) for ex in examples]


def global_batches(
    examples: Sequence[dict],
    global_batch_size: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    dedup_positives: bool = True,
    topics: Sequence[str] | None = None,
) -> list[list[int]]:
    """Example indices of each full global batch of ``epoch``, in training order.

    With ``dedup_positives`` an example whose positive passage is already in the batch waits for the
    next batch (it stays at the front of the queue, so the order is still the permutation's).
    With ``topics`` (one per example) the batches are topic-aware (TAS-B, Hofstätter et al. 2021): the
    permutation is grouped by topic, topics in a seeded order, so a batch holds one topic's questions
    (two, rarely more, where a topic ends or de-duplication deferred some) and their in-batch negatives
    are that topic's passages; the batches are then shuffled (seeded), so consecutive steps do not dwell on
    one topic. Without ``shuffle`` nothing is random: topics in order of first appearance, batches in order.
    """
    if global_batch_size <= 0:
        raise ValueError(f"batch size must be positive, got {global_batch_size}")
    order = epoch_permutation(len(examples), seed, epoch, shuffle).tolist()
    positives = positive_id_sets(examples) if dedup_positives else ()
    if topics is None:
        return _fill_batches(positives, order, global_batch_size, dedup_positives)
    batches = _fill_batches(positives, _group_by_topic(order, topics, seed, epoch, shuffle), global_batch_size,
                            dedup_positives)
    if not shuffle:
        return batches
    return [batches[i] for i in seeded_rng(seed, epoch, _TOPIC_STREAM, 1).permutation(len(batches))]


_TOPIC_STREAM = 0x70D1C  # a fourth key: never equal to an example's (seed, epoch, idx) stream


def _group_by_topic(order: list[int], topics: Sequence[str], seed: int, epoch: int, shuffle: bool) -> list[int]:
    """``order`` stably regrouped by topic, the topics in a seeded random order (``shuffle``) or in order of
    their first appearance in ``order``."""
    if shuffle:
        names = sorted(set(topics))
        names = [names[j] for j in seeded_rng(seed, epoch, _TOPIC_STREAM, 0).permutation(len(names))]
    else:
        names = list(dict.fromkeys(topics[i] for i in order))
    rank = {name: r for r, name in enumerate(names)}
    return sorted(order, key=lambda i: rank[topics[i]])


def _fill_batches(positives: Sequence[frozenset[str]], order: list[int], global_batch_size: int,
                  dedup_positives: bool) -> list[list[int]]:
    """Full batches in ``order``, deferring (``dedup_positives``) an example whose positive is in the batch."""
    if not dedup_positives:
        n = len(order) // global_batch_size
        return [order[i * global_batch_size:(i + 1) * global_batch_size] for i in range(n)]
    batches: list[list[int]] = []
    waiting: list[int] = []
    pos = 0
    while True:
        batch, seen, still_waiting = [], set(), []
        for idx in waiting:  # deferred examples first
            ids = positives[idx]
            if len(batch) < global_batch_size and not (ids & seen):
                batch.append(idx)
                seen |= ids
            else:
                still_waiting.append(idx)
        waiting = still_waiting
        while len(batch) < global_batch_size and pos < len(order):
            idx = order[pos]
            pos += 1
            ids = positives[idx]
            if ids & seen:
                waiting.append(idx)
            else:
                batch.append(idx)
                seen |= ids
        if len(batch) < global_batch_size:
            break  # the incomplete tail is dropped
        batches.append(batch)
    return batches


def rank_slice(batch: Sequence[int], rank: int, world_size: int) -> list[int]:
    """This rank's disjoint share of a global batch."""
    per = len(batch) // world_size
    return list(batch[rank * per:(rank + 1) * per])
