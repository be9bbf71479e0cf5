"""Training groups for the cross-encoder: (question, positive, N negatives), seeded and resumable.

The filters are the bi-encoder trainer's, imported rather than rewritten:

- examples without a positive are skipped (`dpr.training.batching.load_examples`);
- negatives are ``hard_negative_ctxs`` (BM25-mined) then ``negative_ctxs``, shuffled and cut to N per
  (seed, epoch, example), topped up from all training passages when a question has too few
  (`dpr.training.batching.make_item` / `NegativePool`); ``negatives_from`` = ``random`` draws all N from
  those passages, ``mixed`` keeps ceil(N/2) mined ones (`mined_share`); the positive is drawn per (seed, epoch, example)
  among ``positive_ctxs`` (so on qrels data every judged document with a text takes its turn);
- a passage judged relevant (``positive_ctxs`` and, on qrels data, every ``qrels`` grade >= 1:
  `dpr.data.retriever_json.relevant_ids`) or containing one of the answers (DPR's has_answer rule, on the
  text: `dpr.negatives.filters.false_negative`) is never a negative: such candidates are removed before the N are drawn, and the masks of
  `dpr.training.masks.pair_masks` cover any the top-up draws (ignored by the losses; on qrels data
  ``multi_positive`` makes a drawn judged passage a positive instead).

The order of examples is a permutation per (seed, epoch) (`epoch_permutation`), so a step's groups are a
pure function of (seed, step): a resumed run replays the batches an uninterrupted one would have seen.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from dpr.data.retriever_json import relevant_ids
from dpr.negatives.filters import false_negative
from dpr.rerank.model import document_text, tokenize_pairs
from dpr.training.batch_order import epoch_permutation
from dpr.training.batching import NegativePool, load_examples, make_item, mined_negatives, warn_topped_up
from dpr.training.masks import pair_masks


class Group(NamedTuple):
    """One question with its candidates (ctx dicts, the positive first) and their masks (one bool each)."""

    question: str
    passages: list[dict]
    positive: list[bool]
    ignore: list[bool]


def read_groups_source(path: str | Path) -> tuple[list[dict], str]:
    """``(examples with a positive, kind)``: kind is ``qrels`` when the file carries judgements."""
    examples = load_examples(path)
    kind = "qrels" if any("qrels" in ex for ex in examples) else "qa"
    return examples, kind


def without_false_negatives(example: dict) -> dict:
    """A copy of ``example`` whose negative lists hold no judged-relevant and no answer-bearing passage."""
    judged = relevant_ids(example)
    answers = example.get("answers") or []

    def ok(ctx: dict) -> bool:
        # the miners' filter; text only (check_title=False), the rule of the masks below (pair_masks)
        return false_negative(ctx, relevant=judged, answers=answers, check_title=False) is None

    return {**example, "hard_negative_ctxs": [c for c in example["hard_negative_ctxs"] if ok(c)],
            "negative_ctxs": [c for c in example["negative_ctxs"] if ok(c)]}


def mined_share(negatives: int, source: str) -> int:
    """How many of a group's ``negatives`` come from its mined lists; `make_item` draws the rest from the pool."""
    return {"mined": negatives, "random": 0, "mixed": math.ceil(negatives / 2)}[source]


def keep_mined(example: dict, idx: int, epoch: int, seed: int, keep: int) -> dict:
    """``example`` with at most ``keep`` of its (already filtered) mined negatives, a seeded draw per
    (seed, epoch, example), so that `make_item` tops the group up from the pool of training passages."""
    mined = mined_negatives(example)  # what make_item would draw from: no repeats, no own positives
    if len(mined) <= keep:
        return example
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), int(idx), 1])  # not make_item's stream
    chosen = sorted(rng.choice(len(mined), size=keep, replace=False).tolist())
    return {**example, "hard_negative_ctxs": [mined[j] for j in chosen], "negative_ctxs": []}


def make_group(example: dict, idx: int, epoch: int, seed: int, negatives: int, pool: NegativePool,
               multi_positive: bool, negatives_from: str = "mined") -> Group:
    """Example ``idx``'s group for ``epoch``: its positive and exactly ``negatives`` other passages."""
    cleaned = without_false_negatives(example)
    if negatives_from != "mined":
        cleaned = keep_mined(cleaned, idx, epoch, seed, mined_share(negatives, negatives_from))
    item = make_item(cleaned, idx, epoch, seed, negatives, pool, shuffle_positives=True, shuffle_hard_negatives=True)
    masks = pair_masks([item.as_question()], [c["passage_id"] for c in item.passages],
                       [c["text"] for c in item.passages], [0], multi_positive=multi_positive, mask_answers=True)
    return Group(item.question, list(item.passages), masks.positive[0].tolist(), masks.ignore[0].tolist())


class GroupBatches:
    """The seeded batches of groups of one training file (holds the cleaned examples and the pool)."""

    def __init__(self, examples: Sequence[dict], batch_size: int, negatives: int, seed: int,
                 multi_positive: bool, negatives_from: str = "mined") -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.examples = list(examples)
        self.batch_size, self.negatives, self.seed = int(batch_size), int(negatives), int(seed)
        self.multi_positive = bool(multi_positive)
        self.negatives_from = negatives_from
        self.pool = NegativePool(self.examples)
        # (a KeyError from mined_share is a caller's bug: the config checks the name)
        warn_topped_up(self.examples, mined_share(self.negatives, negatives_from))
        self._perm: tuple[int, Any] = (-1, None)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.examples) / self.batch_size)

    def groups(self, step: int) -> tuple[int, list[Group]]:
        """``(epoch, groups)`` of global step ``step`` (0-based); the epoch's last batch may be smaller."""
        epoch, pos = divmod(int(step), self.steps_per_epoch)
        if self._perm[0] != epoch:
            self._perm = (epoch, epoch_permutation(len(self.examples), self.seed, epoch))
        idx = self._perm[1][pos * self.batch_size:(pos + 1) * self.batch_size].tolist()
        return epoch, [make_group(self.examples[i], i, epoch, self.seed, self.negatives, self.pool,
                                  self.multi_positive, self.negatives_from) for i in idx]


def collate(groups: Sequence[Group], tokenizer: Any, max_length: int, use_title: bool) -> dict[str, torch.Tensor]:
    """Flatten the groups row-major into pairs: inputs ``[B * G, seq]`` and ``positive``/``ignore`` ``[B, G]``."""
    sizes = {len(g.passages) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"groups of different sizes {sorted(sizes)}: every question needs 1 + N passages")
    questions = [g.question for g in groups for _ in g.passages]
    documents = [document_text(c["title"], c["text"], tokenizer, use_title) for g in groups for c in g.passages]
    batch = tokenize_pairs(tokenizer, questions, documents, max_length)
    batch["positive"] = torch.tensor([g.positive for g in groups], dtype=torch.bool)
    batch["ignore"] = torch.tensor([g.ignore for g in groups], dtype=torch.bool)
    return batch
