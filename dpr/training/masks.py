"""Which (question, candidate) pairs are positives and which are false negatives to ignore.

- **Positives**: a question's own positive passage, and -- for qrels data with several judged-relevant
  documents -- every other of its positives that is in the pool (``multi_positive``; otherwise those
  are ignored: never pushed away, never pulled in). A passage counts by id, whichever question brought
  it into the batch.
- **Answer-bearing passages** (QA data, ``mask_answers``): a candidate that contains one of question
  ``i``'s answers under DPR's has_answer rule is removed from ``i``'s negatives.

:class:`CorpusAnswers` finds every answer-bearing passage of a corpus for a question at once (one
substring search over the concatenated token strings), for whole-corpus candidates.
"""

from __future__ import annotations

import bisect
from typing import Iterable, Sequence

import numpy as np
import torch

from dpr.eval.has_answer import _needle, has_answer, token_string
from dpr.losses import PairMasks

_PASSAGE_SEP = "\x1e"  # never inside a token string: occurrences cannot straddle two passages


def pair_masks(
    questions: Sequence[dict],
    candidate_ids: Sequence[str],
    candidate_texts: Sequence[str] | None,
    targets: Sequence[int],
    *,
    multi_positive: bool = False,
    mask_answers: bool = True,
    answer_rows: Sequence[Iterable[int]] | None = None,
) -> PairMasks:
    """Masks for ``questions`` (dicts with ``positive_ids`` and ``answers``) over the candidates.

    ``targets[i]`` is the column of question ``i``'s own positive. Other copies of that passage are
    ignored (one passage, one vote); its other judged positives are positives (``multi_positive``) or
    ignored. ``answer_rows`` gives the answer-bearing columns directly (:class:`CorpusAnswers`);
    otherwise ``candidate_texts`` are checked with has_answer.
    """
    n = len(candidate_ids)
    positive = torch.zeros(len(questions), n, dtype=torch.bool)
    ignore = torch.zeros(len(questions), n, dtype=torch.bool)
    by_id: dict[str, list[int]] = {}
    for j, pid in enumerate(candidate_ids):
        by_id.setdefault(pid, []).append(j)
    for i, q in enumerate(questions):
        target = int(targets[i])
        target_id = candidate_ids[target]
        if target_id not in q["positive_ids"]:
            raise ValueError(f"question {i}: target candidate {target_id!r} is not one of its positives")
        for pid in q["positive_ids"]:
            for j in by_id.get(pid, ()):
                is_pos = j == target or (multi_positive and pid != target_id)
                positive[i, j] = is_pos
                ignore[i, j] = not is_pos
        answers = q.get("answers") or []
        if mask_answers and answers:
            cols = answer_rows[i] if answer_rows is not None else [
                j for j, text in enumerate(candidate_texts or ()) if has_answer(answers, text)]
            for j in cols:
                if not positive[i, j]:
                    ignore[i, j] = True
    return PairMasks(positive, ignore)


class CorpusAnswers:
    """Every passage of a corpus that contains an answer (has_answer's string mode), found by substring search."""

    def __init__(self, texts: Sequence[str]) -> None:
        # not has_answer's cached _haystack: a whole corpus would flush that cache for nothing
        hay = [token_string(t) for t in texts]
        self.starts = np.cumsum([0] + [len(h) + 1 for h in hay[:-1]]).tolist()
        self.text = _PASSAGE_SEP.join(hay)

    def rows(self, answers: Sequence[str]) -> list[int]:
        found: set[int] = set()
        for answer in answers:
            needle = _needle(answer)  # None for an answer without tokens: it matches nothing, as in has_answer
            if needle is None:
                continue
            pos = self.text.find(needle)
            while pos >= 0:
                found.add(bisect.bisect_right(self.starts, pos) - 1)
                pos = self.text.find(needle, pos + 1)
        return sorted(found)
