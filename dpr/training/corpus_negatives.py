"""Whole-corpus negatives from fixed passage vectors (DPR's ``fix_ctx_encoder``; ADORE, Zhan et al. 2021).

The corpus is encoded once with the passage tower and kept fixed (refreshed every ``refresh_every``
optimizer steps, or whenever validation has just encoded it with the current weights). Each question is
then scored against the whole corpus when it has at most ``max_corpus`` passages, or else against the
union of the batch's questions' top-``topk`` passages from a FAISS inner-product index over the vectors.

Two uses, one class:
- *frozen-index steps* (question tower only): the candidates are the corpus rows alone, so a step needs no
  passage forward or backward pass, and an index built before training stays valid after it (separate
  towers);
- *two-tower steps with corpus negatives*: a second loss term against the cached corpus alone (its
  targets the cached copies of the positives), beside the in-batch term (see dpr.training.steps).

Under DDP a sample (``train.corpus_sample``) searched by FAISS top-k is held in slices, each rank the vectors it
encoded (:attr:`CorpusNegatives.sharded`, dpr/training/corpus_slices.py); otherwise every rank holds every vector.
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Sequence

import numpy as np
import torch

from dpr.eval.has_answer import has_answer
from dpr.losses import PairMasks
from dpr.training.corpus_slices import fetch_rows, sharded_topk, slice_rows
from dpr.training.masks import CorpusAnswers, pair_masks

log = logging.getLogger(__name__)


class Candidates(NamedTuple):
    """Corpus candidates for a batch: their vectors and ids, masks ``[B, U]``, each question's target column."""

    vectors: torch.Tensor
    ids: list[str]
    masks: PairMasks
    targets: list[int]


class CorpusNegatives:
    """Cached passage vectors of a corpus, and the candidates and masks they add to a batch."""

    def __init__(self, ids: Sequence[str], texts: Sequence[str], titles: Sequence[str], *,
                 max_corpus: int = 200_000, topk: int = 200, multi_positive: bool = False,
                 mask_answers: bool = True, teacher=None, positions: Sequence[int] | None = None,
                 checkpointed: bool = True) -> None:
        self.ids, self.texts, self.titles = list(ids), list(texts), list(titles)
        # rows of these passages in the passages file (a sample of it, train.corpus_sample); None: all of it, in order
        self.positions = None if positions is None else np.asarray(positions, dtype=np.int64)
        # whether checkpoints keep the vectors (a sample's are re-encoded on resume: checkpoints never hold a corpus)
        self.checkpointed = checkpointed
        # False: every rank holds (gathers) every vector even where slices apply (:attr:`sharded`); set before vectors
        self.slicing = True
        self.row = {pid: j for j, pid in enumerate(self.ids)}
        self.max_corpus, self.topk = int(max_corpus), int(topk)
        self.multi_positive, self.mask_answers = multi_positive, mask_answers
        self.teacher = teacher  # fills masks.teacher for distillation losses
        self.vectors: torch.Tensor | None = None  # every row's, or when sharded this rank's slice's (my_rows)
        self.version = -1  # optimizer step the vectors were encoded at
        self._answers: CorpusAnswers | None = None
        self._answer_rows: dict[tuple, list[int]] = {}
        self._index = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def whole_corpus(self) -> bool:
        return len(self.ids) <= self.max_corpus

    @property
    def sharded(self) -> bool:
        """Each rank keeps only its slice's vectors (:meth:`my_rows`) and searches it for every rank's questions:
        under DDP with a sample and FAISS top-k candidates (the whole corpus as candidates needs every vector)."""
        from dpr import distributed as dist

        return (self.slicing and self.positions is not None and dist.is_distributed()
                and not self.whole_corpus)

    def of_file(self, vectors: torch.Tensor) -> torch.Tensor:
        """These passages' rows of ``vectors`` of the whole passages file in file order (e.g. the start vectors)."""
        if self.positions is None:
            return vectors
        if vectors.shape[0] <= int(self.positions.max(initial=-1)):
            raise ValueError(f"{vectors.shape[0]} vectors for a passages file with at least "
                             f"{int(self.positions.max()) + 1} passages")
        return vectors[torch.from_numpy(self.positions)]

    def set_vectors(self, vectors: torch.Tensor, step: int) -> None:
        """Every row's vectors, encoded at optimizer step ``step`` (when sharded, this rank keeps its slice's)."""
        if vectors.shape[0] != len(self.ids):
            raise ValueError(f"{vectors.shape[0]} vectors for a corpus of {len(self.ids)} passages")
        if self.sharded:
            mine = self.my_rows()
            vectors = vectors[mine.start::mine.step]
        self._keep(vectors, step)

    def _keep(self, vectors: torch.Tensor, step: int) -> None:
        self.vectors = vectors.detach().float().cpu().contiguous()
        self.version = int(step)
        self._index = None

    def whole_vectors(self) -> torch.Tensor | None:
        """Every row's vectors in row order (when sharded, gathered from the ranks: every rank calls this)."""
        if self.vectors is None or not self.sharded:
            return self.vectors
        return self._gather_shards(self.vectors)

    @torch.no_grad()
    def refresh(self, model, tokenizer, *, step: int, batch_size: int, max_length: int, autocast: str,
                tokens=None) -> None:
        """Encode the corpus with the current passage tower (``tokens``: the corpus's token table, tokenised once)."""
        from dpr.models.encode_options import EncodeOptions
        from dpr.models.inference import encode_texts

        rows = self.my_rows()
        was_training = model.training
        model.eval()
        try:
            log.info("encoding %d of %d corpus passages for corpus negatives (step %d)", len(rows), len(self.ids),
                     step)
            options = EncodeOptions(batch_size=batch_size, max_length=max_length, autocast=autocast, tokens=tokens)
            texts = self.texts if len(rows) == len(self.ids) else [self.texts[i] for i in rows]
            titles = self.titles if len(rows) == len(self.ids) else [self.titles[i] for i in rows]
            vecs = encode_texts(model, tokenizer, texts, "passage", options, titles=titles)
        finally:
            model.train(was_training)
        if self.sharded:
            self._keep(vecs, step)
        else:
            self.set_vectors(self._gather_shards(vecs), step)

    def my_rows(self) -> range:
        """The rows this process encodes: a sample's (train.corpus_sample) are shared out, row ``i`` to rank
        ``i mod world size``, then gathered (or, when :attr:`sharded`, kept); the whole corpus is encoded by every
        rank, as always."""
        from dpr import distributed as dist

        if self.positions is None or not dist.is_distributed():
            return range(len(self.ids))
        return slice_rows(len(self.ids), dist.rank(), dist.world_size())

    def _gather_shards(self, vecs: torch.Tensor) -> torch.Tensor:
        """Every rank's share of the vectors (:meth:`my_rows`) back in row order."""
        from dpr import distributed as dist

        if len(self.my_rows()) == len(self.ids):
            return vecs
        world = dist.world_size()
        slices = [slice_rows(len(self.ids), r, world) for r in range(world)]
        with torch.no_grad():
            gathered = dist.all_gather_with_grad(vecs.detach().float().to(dist.device()).contiguous(),
                                                 [len(s) for s in slices]).cpu()
        order = torch.cat([torch.arange(s.start, s.stop, s.step) for s in slices])
        out = torch.empty_like(gathered)
        out[order] = gathered
        return out

    def answer_rows(self, answers: Sequence[str]) -> list[int]:
        key = tuple(answers)
        if key not in self._answer_rows:
            if self._answers is None:
                self._answers = CorpusAnswers(self.texts)
            self._answer_rows[key] = self._answers.rows(answers)
        return self._answer_rows[key]

    def candidates(self, q: torch.Tensor) -> torch.Tensor:
        """Corpus rows to score for these questions: all of them, or the union of their top-k (when sharded,
        merged over every rank's slice: every rank calls this once per step)."""
        if self.whole_corpus:
            return torch.arange(len(self.ids))
        k = min(self.topk, len(self.ids))
        if self.sharded:
            idx = sharded_topk(self._faiss(), q, k)
        else:
            _, idx = self._faiss().search(q.detach().float().cpu().numpy(), k)
        return torch.from_numpy(np.unique(idx[idx >= 0]))

    def _faiss(self):
        """A FAISS inner-product index over the vectors held here (built once per encoding)."""
        import faiss

        if self._index is None:
            self._index = faiss.IndexFlatIP(self.vectors.shape[1])
            self._index.add(self.vectors.numpy())
        return self._index

    def extra(self, q: torch.Tensor, questions: Sequence[dict]) -> Candidates:
        """The corpus candidates of these questions (see :class:`Candidates`): each question's positives
        join them if top-k missed them, and its target is ``question['target_id']``."""
        if self.vectors is None:
            raise RuntimeError("corpus negatives used before the corpus was encoded")
        rows = self.candidates(q)
        if not self.whole_corpus:
            need = {self.row[pid] for qu in questions for pid in qu["positive_ids"] if pid in self.row}
            rows = torch.from_numpy(np.union1d(rows.numpy(), np.fromiter(need, dtype=np.int64)))
        # sharded: every rank fetches before anything below can raise (a rank that left would hang the others)
        vectors = fetch_rows(self.vectors, rows.numpy()) if self.sharded else self.vectors[rows]
        row_list = rows.tolist()
        col = {r: c for c, r in enumerate(row_list)}
        ids = [self.ids[r] for r in row_list]
        answer_cols = None
        if self.mask_answers and self.whole_corpus:  # one substring search over the whole (small) corpus
            answer_cols = [[col[r] for r in self.answer_rows(qu.get("answers") or []) if r in col] for qu in questions]
        elif self.mask_answers:  # top-k candidates: only they are checked (the same rule, has_answer's string mode)
            answer_cols = [[c for c, r in enumerate(row_list) if has_answer(qu["answers"], self.texts[r])]
                           if qu.get("answers") else [] for qu in questions]
        targets = []
        for qu in questions:
            tid = qu["target_id"]
            if tid not in self.row:
                raise ValueError(f"positive passage {tid!r} is not in the corpus")
            targets.append(col[self.row[tid]])
        masks = pair_masks(questions, ids, None, targets, multi_positive=self.multi_positive,
                           mask_answers=self.mask_answers, answer_rows=answer_cols)
        if self.teacher is not None:
            masks.teacher = self.teacher.scores([qu["question"] for qu in questions], ids)
        return Candidates(vectors, ids, masks, targets)
