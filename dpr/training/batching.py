"""Training examples, their seeded order (sharded per rank under DDP), and the batch collator.

What a batch is (the choices, in one place):

- ``train.batch_size`` is **per device**. One optimizer step sees a global batch of
  ``batch_size × world_size`` questions, and that global batch is the negative pool: every question is
  scored against ``batch_size × world_size × (1 + H)`` passages (the loss gathers them across ranks).
  ``grad_accumulation_steps`` runs several such batches before one optimizer step: it averages
  gradients and adds **no** negatives. ``grad_cache_chunk_size`` lets a big batch fit in memory
  (same negatives and gradients as the big batch, computed in chunks).
- Order: each epoch is a permutation of the examples seeded by ``(seed, epoch)``. Batches are filled
  in that order, deferring an example whose positive passage is already in the batch (it would be
  its neighbour's "negative" — SQuAD has ~5 questions per paragraph), and the last incomplete global
  batch is dropped so all ranks have equally shaped batches. Rank ``r`` takes slice
  ``[r·B, (r+1)·B)`` of each global batch: ranks are disjoint and the global batch does not depend on
  the world size. ``topic_batches`` groups the permutation by the positive passage's title first
  (TAS-B's topic-aware sampling: in-batch negatives from the question's own article).
- Positive: the first positive (DPR's default); ``shuffle_positives`` draws one per (seed, epoch, example).
- Hard negatives: ``hard_negative_ctxs`` (BM25-mined) first, then ``negative_ctxs`` unless
  ``other_negatives`` is false (DPR's NQ recipe draws from the BM25 ones alone); like DPR the list
  is shuffled per (seed, epoch, example) (``shuffle_hard_negatives``) and the first H are taken.
  A question with fewer than H is topped up with passages drawn (seeded) from all training
  passages (other questions' positives and negatives) that are not one of its own positives, so
  every question has exactly ``1 + H`` passages — the loss relies on that layout (passage
  ``i·(1+H)`` is question ``i``'s positive). ``H = 0`` trains on in-batch negatives only.
- Examples with no positive passage (DPR's dev files have some) are skipped, with a count in the log.
- The examples may be a list of dicts or an :class:`~dpr.training.example_file.ExampleFile` (each record parsed
  when a batch needs it: a rank never holds the whole file); the batches are the same either way.
"""

from __future__ import annotations

import copy
import logging
import threading
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np
import torch

from dpr.data.retriever_json import read_retriever_json, relevant_ids
from dpr.errors import DataError
from dpr.losses import PairMasks
from dpr.training.batch_order import example_topics, global_batches, rank_slice, seeded_rng
from dpr.training.masks import pair_masks
from dpr.training.items import TrainItem
from dpr.training.train_tokens import TrainTokens, collate, collate_from

log = logging.getLogger(__name__)


class Batch(NamedTuple):
    """One rank's micro-batch: inputs, the masks over the *global* pool of passages, the local questions."""

    index: int
    q_inputs: dict
    p_inputs: dict | None
    masks: "PairMasks"
    questions: list[dict]


def load_examples(path: str | Path) -> list[dict]:
    """DPR retriever JSON examples that have at least one positive passage."""
    examples = read_retriever_json(path)
    kept = [ex for ex in examples if ex["positive_ctxs"]]
    if len(kept) < len(examples):
        log.info("%s: skipped %d of %d examples without a positive passage", path, len(examples) - len(kept), len(examples))
    if not kept:
        raise DataError(path, "no example has a positive passage (positive_ctxs)")
    return kept


class _FileCtxs(Sequence[dict]):
    """The pool's ctx dicts read from an ExampleFile when drawn (by the position of their first mention)."""

    def __init__(self, examples: Any, where: np.ndarray) -> None:
        self.examples, self.where = examples, where

    def __len__(self) -> int:
        return len(self.where)

    def __getitem__(self, j):  # type: ignore[override]
        from dpr.training.example_file import POOL_KEYS

        ex, key, pos = (int(v) for v in self.where[j])
        return self.examples[ex][POOL_KEYS[key]][pos]


class NegativePool:
    """All training passages by id, to top up questions that have fewer than H hard negatives."""

    def __init__(self, examples: Sequence[dict]) -> None:
        if hasattr(examples, "pool_locations"):  # an ExampleFile: ids only, each text read when drawn
            self.ids, where = examples.pool_locations()
            self.ctxs: Sequence[dict] = _FileCtxs(examples, where)
            return
        seen: dict[str, dict] = {}
        for ex in examples:
            for key in ("positive_ctxs", "hard_negative_ctxs", "negative_ctxs"):
                for ctx in ex[key]:
                    seen.setdefault(ctx["passage_id"], ctx)
        self.ids = sorted(seen)
        self.ctxs = [seen[i] for i in self.ids]

    def draw(self, n: int, exclude: set[str], rng: np.random.Generator) -> list[dict]:
        """``n`` distinct passages not in ``exclude`` (fewer only if the pool itself is too small)."""
        out: list[dict] = []
        if n <= 0:
            return out
        taken = set(exclude)
        # rejection sampling: the pool is large compared with n, so a few draws suffice
        k = min(len(self.ctxs), n + len(exclude) + 8 * n)
        for j in rng.choice(len(self.ctxs), size=k, replace=False).tolist():
            pid = self.ids[j]
            if pid not in taken:
                out.append(self.ctxs[j])  # read only when taken (an ExampleFile parses its record)
                taken.add(pid)
                if len(out) == n:
                    break
        return out


def mined_negatives(example: dict, other_negatives: bool = True) -> list[dict]:
    """``hard_negative_ctxs`` then (``other_negatives``) ``negative_ctxs``, in file order, without the question's
    own positives and without repeats (a passage can be both BM25-mined and in negative_ctxs): what `make_item` draws
    from."""
    own = {c["passage_id"] for c in example["positive_ctxs"]}
    uniq, ids = [], set(own)
    for c in example["hard_negative_ctxs"] + (example["negative_ctxs"] if other_negatives else []):
        if c["passage_id"] not in ids:
            uniq.append(c)
            ids.add(c["passage_id"])
    return uniq


def warn_topped_up(examples: Sequence[dict], negatives: int, other_negatives: bool = True) -> int:
    """Log (one warning) how many questions have fewer than ``negatives`` mined negatives of their own, whose
    draws `make_item` tops up at random from the pool: a training file that was never mined (``dpr-data``
    without ``dpr-bm25 mine=true``) trains on random negatives, which should not pass unsaid. Returns the count."""
    if negatives <= 0:
        return 0
    short = none = 0
    counts = examples.mined_counts() if hasattr(examples, "mined_counts") else (
        len(mined_negatives(ex, other_negatives)) for ex in examples)
    for n in counts:
        short += n < negatives
        none += n == 0
    if short:
        log.warning("%d of %d training questions have fewer than %d mined negatives (%d have none): the rest are "
                    "drawn at random from the training passages%s", short, len(examples), negatives, none,
                    " (is the file mined? dpr-bm25 mine=true)" if none == len(examples) else "")
    return short


def make_item(
    example: dict,
    idx: int,
    epoch: int,
    seed: int,
    hard_negatives: int,
    pool: NegativePool | None = None,
    shuffle_positives: bool = False,
    shuffle_hard_negatives: bool = True,
    other_negatives: bool = True,
) -> TrainItem:
    """The question with its positive and exactly ``hard_negatives`` negatives for this epoch."""
    rng = seeded_rng(seed, epoch, idx)
    positives = example["positive_ctxs"]
    positive = positives[int(rng.integers(len(positives)))] if shuffle_positives and len(positives) > 1 else positives[0]
    own = {c["passage_id"] for c in positives}
    uniq = mined_negatives(example, other_negatives)
    if shuffle_hard_negatives and len(uniq) > 1:
        uniq = [uniq[j] for j in rng.permutation(len(uniq)).tolist()]
    negatives = uniq[:hard_negatives]
    if len(negatives) < hard_negatives:
        if pool is None:
            raise ValueError(f"example {idx} has {len(negatives)} negatives, fewer than hard_negatives={hard_negatives}, and no pool")
        negatives += pool.draw(hard_negatives - len(negatives), own | {c["passage_id"] for c in negatives}, rng)
        if len(negatives) < hard_negatives:
            raise ValueError(f"the training set has too few passages for hard_negatives={hard_negatives}")
    # qrels data: every judged-relevant passage (not only the positive_ctxs kept with their text) is one
    # of the question's positives for the masks, so none of them is ever a negative for it
    return TrainItem(example["question"], [positive, *negatives], tuple(example.get("answers") or ()),
                     relevant_ids(example))


class Shard(NamedTuple):
    """This process's place among the data-parallel ranks: rank ``rank`` of ``world_size``."""

    rank: int = 0
    world_size: int = 1


class TrainBatches:
    """This rank's batches of one epoch, from a given position (resume skips the batches already done).

    Iterates :class:`Batch`. Everything is derived from (seed, epoch), so a resumed run sees exactly the batches an
    uninterrupted run would, and a batch built ahead in another thread (`dpr.training.loader`) is the batch built
    inline. Takes its settings whole: the batching keys of the typed ``TrainConfig`` (``tc``: ``batch_size``,
    ``hard_negatives``, ``shuffle``, ``shuffle_positives``, ``shuffle_hard_negatives``, ``dedup_positives``,
    ``topic_batches``), the lengths and prefixes of the model's ``BiEncoderConfig`` (``model_cfg``); the keywords
    are this process's :class:`Shard` of the data-parallel ranks and what the run resolved (``multi_positive``
    from ``auto``, ``mask_answers`` for QA data, the loss's teacher, the token ids of the training file:
    `dpr.training.train_tokens`, without which each batch is tokenised).
    """

    def __init__(
        self,
        examples: Sequence[dict],
        tokenizer,
        tc: Any,
        model_cfg: Any,
        *,
        seed: int,
        shard: Shard = Shard(),
        multi_positive: bool = False,
        mask_answers: bool = True,
        teacher=None,
        tokens: "TrainTokens | None" = None,
    ) -> None:
        self.examples = examples
        self.prefixes = {"question_prefix": model_cfg.question_prefix,
                         "passage_prefix": model_cfg.passage_prefix}  # the model's
        self.teacher = teacher  # e.g. dpr.training.teacher.BM25Teacher: fills masks.teacher
        self.multi_positive, self.mask_answers = multi_positive, mask_answers
        self.tokenizer, self.tokens = tokenizer, tokens
        self.batch_size = tc.batch_size
        self.hard_negatives = tc.hard_negatives
        self.q_len, self.p_len = model_cfg.question_max_length, model_cfg.passage_max_length
        self.seed, self.rank, self.world_size = seed, shard.rank, shard.world_size
        self.shuffle, self.shuffle_positives = tc.shuffle, tc.shuffle_positives
        self.shuffle_hard_negatives, self.dedup_positives = tc.shuffle_hard_negatives, tc.dedup_positives
        self.other_negatives = getattr(tc, "other_negatives", None) is not False  # null: negative_ctxs join the draw, as always
        self.topics = example_topics(examples) if tc.topic_batches else None
        self.pool = NegativePool(examples) if self.hard_negatives > 0 else None
        if shard.rank == 0:
            warn_topped_up(examples, self.hard_negatives, self.other_negatives)
        self._cache: dict[int, list[list[int]]] = {}
        self._local = threading.local()

    def global_batches(self, epoch: int) -> list[list[int]]:
        if epoch not in self._cache:
            self._cache = {epoch: global_batches(
                self.examples, self.batch_size * self.world_size, self.seed, epoch, self.shuffle, self.dedup_positives,
                self.topics,
            )}
        return self._cache[epoch]

    def num_batches(self, epoch: int) -> int:
        return len(self.global_batches(epoch))

    def global_items(self, epoch: int, batch_in_epoch: int) -> list[TrainItem]:
        """Every rank's items of this global batch (cheap: each rank derives them all, to build masks)."""
        return [
            make_item(self.examples[i], i, epoch, self.seed, self.hard_negatives, self.pool,
                      self.shuffle_positives, self.shuffle_hard_negatives, self.other_negatives)
            for i in self.global_batches(epoch)[batch_in_epoch]
        ]

    def items(self, epoch: int, batch_in_epoch: int) -> list[TrainItem]:
        """This rank's items (its slice of the global batch)."""
        return rank_slice(self.global_items(epoch, batch_in_epoch), self.rank, self.world_size)

    def masks(self, global_items: Sequence[TrainItem], questions: Sequence[dict]) -> PairMasks:
        """This rank's ``questions`` (its slice of ``global_items``, as ``as_question`` dicts) against the
        global pool (every rank's passages in rank order)."""
        first = self.rank * (len(global_items) // self.world_size)
        ctxs = [c for it in global_items for c in it.passages]
        per_q = 1 + self.hard_negatives
        ids = [c["passage_id"] for c in ctxs]
        masks = pair_masks(questions, ids, [c["text"] for c in ctxs], [(first + i) * per_q for i in range(len(questions))],
                           multi_positive=self.multi_positive, mask_answers=self.mask_answers)
        if self.teacher is not None:
            masks.teacher = self.teacher.scores([q["question"] for q in questions], ids)
        return masks

    def collate(self, items: Sequence[TrainItem], passages: bool = True
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
        """The items' padded inputs: from the token ids where they hold every text, else by the tokenizer
        (:func:`collate`; the same tensors either way)."""
        if self.tokens is not None:
            done = collate_from(self.tokens, [it.question for it in items],
                                [c for it in items for c in it.passages] if passages else None)
            if done is not None:
                return done
        return collate(items, self._tokenizer_here(), self.q_len, self.p_len, passages=passages, **self.prefixes)

    def _tokenizer_here(self):
        """The tokenizer for this thread: a fast tokenizer's truncation state is set per call, and two threads
        calling one tokenizer with different lengths fail ("Already borrowed"); the loader's thread gets a copy."""
        if threading.current_thread() is threading.main_thread() or self.tokenizer is None:
            return self.tokenizer
        tok = getattr(self._local, "tokenizer", None)
        if tok is None:
            tok = self._local.tokenizer = copy.deepcopy(self.tokenizer)
        return tok

    def iter_epoch(self, epoch: int, start: int = 0, passages: bool = True) -> Iterator[Batch]:
        """This rank's batches from ``start``; ``passages=False`` (frozen-index steps) skips their tokens."""
        for b in range(start, self.num_batches(epoch)):
            everyone = self.global_items(epoch, b)
            items = rank_slice(everyone, self.rank, self.world_size)
            q, p = self.collate(items, passages)
            questions = [it.as_question() for it in items]
            yield Batch(b, q, p, self.masks(everyone, questions), questions)
