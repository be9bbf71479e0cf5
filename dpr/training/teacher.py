"""Teacher scores of (question, passage) pairs for distillation losses: BM25 as a lexical teacher.

A loss that declares ``teacher = "bm25"`` (e.g. :class:`dpr.losses.LexicalDistillLoss`) gets, in
``masks.teacher``, the BM25 score of every (question, candidate) pair of its pool: in-batch passages and
cached corpus candidates alike. Scores come from one ``[questions, corpus]`` BM25 matrix per batch
(:func:`dpr.bm25.search.score_texts`), columns picked by passage id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch


class BM25Teacher:
    def __init__(self, index) -> None:
        self.index = index
        self.row = {pid: j for j, pid in enumerate(index.ids)}

    @classmethod
    def for_dataset(cls, passages: str | Path, index_dir: str | Path) -> "BM25Teacher":
        """The dataset's cached BM25 index (the pipeline's defaults; built if missing or stale)."""
        from dpr.bm25 import get_or_build_index

        return cls(get_or_build_index(passages, index_dir))

    def scores(self, questions: Sequence[str], passage_ids: Sequence[str]) -> torch.Tensor:
        from dpr.bm25.search import score_texts

        missing = [pid for pid in passage_ids if pid not in self.row]
        if missing:
            raise ValueError(f"passage {missing[0]!r} is not in the BM25 teacher's index")
        full = score_texts(self.index, list(questions))
        cols = [self.row[pid] for pid in passage_ids]
        return torch.from_numpy(full[:, cols])
