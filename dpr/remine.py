"""Hard negatives mined with a trained dense model, for ANCE-style rounds (train, encode, mine, train again).

Each training question is searched in the trained model's own index (top ``depth``). A candidate is kept as
a hard negative unless it is

- one of the question's positives, or a document judged for it in qrels (``rejected_positive``/``_judged``),
- a passage containing one of its answers (has_answer, text or title: a likely false negative;
  ``rejected_answer``),
- ranked above ``skip_top`` (FlagEmbedding mines ranks 2-200: the very top is often unlabelled positive;
  ``rejected_top``),
- scored too close to the positive: above ``pos - relative_margin * |pos|`` (sentence-transformers'
  ``mine_hard_negatives(relative_margin=...)``: a candidate nearly as similar as the positive is more
  likely a false negative than a hard one; ``rejected_margin``).

The kept negatives can be mixed with the example's existing (BM25) ones: ``bm25_share`` of the list stays
BM25's, the rest is dense-mined (topped up from the other source when one runs short). Counts of every
filter are logged and returned.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

import numpy as np

from dpr.eval.has_answer import has_answer

log = logging.getLogger(__name__)

FILTERS = ("rejected_positive", "rejected_judged", "rejected_answer", "rejected_top", "rejected_margin")


def select_negatives(
    candidates: Sequence[tuple[str, float]],
    positive_score: float,
    *,
    positives: Collection[str],
    judged: Collection[str] = (),
    contains_answer: Callable[[str], bool] | None = None,
    num_negatives: int = 30,
    skip_top: int = 0,
    relative_margin: float = 0.05,
) -> tuple[list[str], Counter]:
    """The ids of up to ``num_negatives`` candidates (best first) that pass every filter, and the counts."""
    threshold = positive_score - relative_margin * abs(positive_score)
    counts: Counter = Counter()
    kept: list[str] = []
    for rank, (pid, score) in enumerate(candidates):
        if len(kept) >= num_negatives:
            break
        counts["examined"] += 1
        if pid in positives:
            counts["rejected_positive"] += 1
        elif pid in judged:
            counts["rejected_judged"] += 1
        elif contains_answer is not None and contains_answer(pid):
            counts["rejected_answer"] += 1
        elif rank < skip_top:
            counts["rejected_top"] += 1
        elif relative_margin > 0 and score > threshold:
            counts["rejected_margin"] += 1
        else:
            kept.append(pid)
    counts["kept"] += len(kept)
    return kept, counts


def mix_negatives(bm25: Sequence[dict], dense: Sequence[dict], n: int, bm25_share: float) -> list[dict]:
    """``bm25_share`` of ``n`` from ``bm25`` (in order), the rest from ``dense``; duplicates dropped, short
    sources topped up from the other."""
    want_bm25 = int(round(n * bm25_share))
    out, seen = [], set()

    def take(src: Sequence[dict], limit: int) -> None:
        for c in src:
            if len(out) >= limit:
                return
            if c["passage_id"] not in seen:
                seen.add(c["passage_id"])
                out.append(c)

    take(bm25, want_bm25)
    take(dense, n)
    take(bm25, n)
    return out


def remine_examples(
    model_path: str | Path,
    index_path: str | Path,
    examples: Sequence[dict],
    passages_path: str | Path,
    *,
    judged: dict[str, Collection[str]] | None = None,
    num_negatives: int = 30,
    depth: int = 200,
    skip_top: int = 0,
    relative_margin: float = 0.05,
    bm25_share: float = 0.5,
    batch_size: int = 64,
) -> tuple[list[dict], dict[str, int]]:
    """Copies of ``examples`` whose ``hard_negative_ctxs`` mix their BM25 negatives with the model's own."""
    from dpr.index import load_index, search
    from dpr.negatives.bm25 import _judged_docs
    from dpr.retrieval.passages import fetch_passages
    from dpr.retrieval.runs import encode_questions

    index, ids = load_index(index_path)
    q, config = encode_questions(model_path, [ex["question"] for ex in examples], batch_size=batch_size)
    if config.similarity == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True).clip(min=1e-12)
    hits, scores = search(index, ids, q, depth)
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
        contains = (lambda pid, a=answers: has_answer(a, texts[pid]["text"]) or has_answer(a, texts[pid]["title"] or "")
                    ) if answers else None
        cands = [(pid, float(s)) for pid, s in zip(hits[i], scores[i].tolist())]
        kept, counts = select_negatives(cands, pos_score, positives=positives, judged=_judged_docs(ex, judged),
                                        contains_answer=contains, num_negatives=num_negatives, skip_top=skip_top,
                                        relative_margin=relative_margin)
        totals.update(counts)
        dense = [{"passage_id": pid, "title": texts[pid]["title"], "text": texts[pid]["text"]} for pid in kept]
        out.append({**ex, "hard_negative_ctxs": mix_negatives(ex.get("hard_negative_ctxs") or [], dense,
                                                              num_negatives, bm25_share)})
    stats = {k: int(totals[k]) for k in ("examined", "kept", *FILTERS)}
    stats["questions"] = len(examples)
    log.info("dense re-mining: %s", ", ".join(f"{k}={v}" for k, v in stats.items()))
    return out, stats


def remine_dataset(model_path: str | Path, index_path: str | Path, ds: Any, output: str | Path,
                   train_file: str | Path | None = None, **kwargs: Any) -> dict[str, int]:
    """Re-mine ``ds``'s training questions (or ``train_file``'s) into ``output`` (DPR retriever JSON, atomic)."""
    from dpr.atomic import write_json_atomic
    from dpr.negatives.bm25 import judged_from_dataset
    from dpr.data.retriever_json import read_retriever_json, write_retriever_json

    examples = [ex for ex in read_retriever_json(train_file or ds.train) if ex["positive_ctxs"]]
    judged = judged_from_dataset(ds) if ds.kind == "qrels" else None
    mined, stats = remine_examples(model_path, index_path, examples, ds.passages, judged=judged, **kwargs)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_retriever_json(output, mined)
    write_json_atomic(output.with_suffix(".stats.json"), stats)
    return stats
