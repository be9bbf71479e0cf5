"""Hard negatives mined with a trained dense model, for ANCE-style rounds (train, encode, mine, train again).

Each training question is searched in the trained model's own index (top ``depth``). A candidate is kept as
a hard negative unless the false-negative filter (`dpr.negatives.filters`, the BM25 miner's too) rejects it:
a positive or judged document, a passage whose text or title holds an answer, a rank above ``skip_top``
(``rejected_top``), or a score above ``pos - relative_margin * |pos|`` (``rejected_margin``; ``pos`` the
question's score against its best positive, read back from the index). Unlike the BM25 miner this searches
the index itself rather than through a `Retriever`: the margin needs the question vector's score against
its positive, which that interface does not expose.

The kept negatives can be mixed with the example's existing (BM25) ones: ``bm25_share`` of the list stays
BM25's, the rest is dense-mined (topped up from the other source when one runs short). By default the BM25
part comes first; ``interleave`` alternates the sources so that every prefix of the list keeps the share, for
readers that take a prefix (the teacher scores each question's first ``teacher.max_negatives``: with the
BM25 part first, a teacher round re-scored BM25's own negatives and never saw a re-mined one). Counts of every
filter are logged and returned.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter
from pathlib import Path
from typing import Any, Collection, Sequence

import numpy as np

from dpr.negatives.config import RemineConfig
from dpr.negatives.filters import FILTERS, answer_check, select_negatives
from dpr.negatives.mine import judged_docs, judged_from_dataset

log = logging.getLogger(__name__)


def mix_negatives(bm25: Sequence[dict], dense: Sequence[dict], n: int, bm25_share: float,
                  interleave: bool = False) -> list[dict]:
    """``bm25_share`` of ``n`` from ``bm25`` (in order), the rest from ``dense``; duplicates dropped, short
    sources topped up from the other. By default BM25's part comes first; ``interleave``: the sources alternate
    so that each prefix of m holds ceil(share * m - 0.5) BM25 negatives (share 0.5: dense, BM25, dense, ...)
    where both sources last."""
    want_bm25 = int(round(n * bm25_share))

    def bm25_due(placed: int, taken_bm25: int) -> bool:
        """Whether the next place is BM25's by the share (the other source fills it when this one is spent)."""
        if interleave:
            return taken_bm25 < math.ceil(bm25_share * (placed + 1) - 0.5)
        return taken_bm25 < want_bm25

    sources = {"bm25": iter(bm25), "dense": iter(dense)}
    out: list[dict] = []
    seen: set = set()
    taken_bm25 = 0

    def next_new(name: str) -> dict | None:
        for c in sources[name]:
            if c["passage_id"] not in seen:
                return c
        return None

    while len(out) < n:
        name = "bm25" if bm25_due(len(out), taken_bm25) else "dense"
        c = next_new(name)
        if c is None:  # this source is spent: the other fills the place
            name = "dense" if name == "bm25" else "bm25"
            c = next_new(name)
        if c is None:
            break
        seen.add(c["passage_id"])
        out.append(c)
        taken_bm25 += name == "bm25"
    return out


def remine_examples(
    model_path: str | Path,
    index_path: str | Path,
    examples: Sequence[dict],
    passages_path: str | Path,
    *,
    config: RemineConfig | None = None,
    judged: dict[str, Collection[str]] | None = None,
    interleave: bool = False,
    batch_size: int = 64,
) -> tuple[list[dict], dict[str, int]]:
    """Copies of ``examples`` whose ``hard_negative_ctxs`` mix their BM25 negatives with the model's own
    (``config``: how many, how deep and what is filtered; `RemineConfig`'s defaults when None)."""
    config = config or RemineConfig()
    from dpr.index import load_index, search
    from dpr.retrieval.passages import fetch_passages
    from dpr.retrieval.runs import encode_questions

    index, ids = load_index(index_path)
    q, model_config = encode_questions(model_path, [ex["question"] for ex in examples], batch_size=batch_size)
    if model_config.similarity == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True).clip(min=1e-12)
    hits, scores = search(index, ids, q, config.depth)
    row_of = {pid: j for j, pid in enumerate(ids)}
    texts = fetch_passages(passages_path, sorted({pid for row in hits for pid in row}))
    totals: Counter = Counter()
    out = []
    for i, ex in enumerate(examples):
        positives = {str(c["passage_id"]) for c in ex["positive_ctxs"]}
        pos_rows = [row_of[p] for p in positives if p in row_of]
        if not pos_rows:
            raise ValueError(f"training question {i}: none of its positives is in the index {index_path}")
        pos_score = max(float(q[i] @ index.reconstruct(r)) for r in pos_rows)
        answers = ex.get("answers") or []
        # check_title: as the BM25 miner, a passage whose title names the answer is a likely false negative
        contains = answer_check(answers, texts.__getitem__, check_title=True)
        cands = [(pid, float(s)) for pid, s in zip(hits[i], scores[i].tolist())]
        kept, counts = select_negatives(cands, pos_score, positives=positives, judged=judged_docs(ex, judged),
                                        contains_answer=contains, num_negatives=config.negatives,
                                        skip_top=config.skip_top, relative_margin=config.relative_margin)
        totals.update(counts)
        dense = [{"passage_id": pid, "title": texts[pid]["title"], "text": texts[pid]["text"]} for pid in kept]
        out.append({**ex, "hard_negative_ctxs": mix_negatives(ex.get("hard_negative_ctxs") or [], dense,
                                                              config.negatives, config.bm25_share, interleave)})
    stats = {k: int(totals[k]) for k in ("examined", "kept", *FILTERS)}
    stats["questions"] = len(examples)
    log.info("dense re-mining: %s", ", ".join(f"{k}={v}" for k, v in stats.items()))
    return out, stats


def remine_dataset(model_path: str | Path, index_path: str | Path, ds: Any, output: str | Path,
                   train_file: str | Path | None = None, config: RemineConfig | None = None, *,
                   interleave: bool = False, batch_size: int = 64, **settings: Any) -> dict[str, int]:
    """Re-mine ``ds``'s training questions (or ``train_file``'s) into ``output`` (DPR retriever JSON, atomic).

    ``config``: the re-mining settings whole (`RemineConfig`); ``settings``: the same as the keywords of
    `RemineConfig.as_kwargs` (``num_negatives=``, ``depth=``...), which override it."""
    from dpr.atomic import write_json_atomic
    from dpr.data.retriever_json import read_retriever_json, write_retriever_json

    if settings:
        renamed = {"negatives" if k == "num_negatives" else k: v for k, v in settings.items()}
        config = dataclasses.replace(config or RemineConfig(), **renamed)
    examples = [ex for ex in read_retriever_json(train_file or ds.train) if ex["positive_ctxs"]]
    judged = judged_from_dataset(ds) if ds.has_qrels else None
    mined, stats = remine_examples(model_path, index_path, examples, ds.passages, config=config, judged=judged,
                                   interleave=interleave, batch_size=batch_size)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_retriever_json(output, mined)
    write_json_atomic(output.with_suffix(".stats.json"), stats)
    return stats
