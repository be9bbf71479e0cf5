"""One training question as a batch holds it (`TrainItem`): the leaf type that batching, tokenisation and the
masks share, so none of them imports another for it."""

from __future__ import annotations

from typing import NamedTuple


class TrainItem(NamedTuple):
    """One training question: its text and ``1 + H`` ctx dicts, the positive first; its answers (QA data)
    and the ids of all its positive passages (for the false-negative masks)."""

    question: str
    passages: list[dict]
    answers: tuple = ()
    positive_ids: frozenset = frozenset()

    def as_question(self) -> dict:
        """What the masks need to know of the question."""
        return {"question": self.question, "positive_ids": self.positive_ids, "answers": list(self.answers),
                "target_id": self.passages[0]["passage_id"]}
