"""Scoring (question, passage) pairs with a cross-encoder, and reranking results records' top k by it
(`dpr.rerank.rerank_file` reranks a file, by the pipeline's rule).

Pairs are tokenized once, sorted by token length (longest first, so each batch pads only to its own
longest and peak memory shows at once) and scored under ``torch.inference_mode`` with bf16 autocast
where the CPU has it (`dpr.trainkit.precision`), then returned in the caller's order.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from dpr.rerank.model import document_text, tokenize_pairs
from dpr.trainkit.precision import autocast_context


def score_pairs(model: torch.nn.Module, tokenizer: Any, questions: Sequence[str], passages: Sequence[str],
                batch_size: int = 32, autocast: str = "auto", max_length: int = 256) -> torch.Tensor:
    """The logit of each ``(questions[i], passages[i])`` pair (float32 ``[n]``, input order). ``passages``
    are the second segments as the model reads them (`dpr.rerank.model.document_text`)."""
    if len(questions) != len(passages):
        raise ValueError(f"{len(questions)} questions but {len(passages)} passages")
    out = torch.empty(len(questions), dtype=torch.float32)
    if not len(questions):
        return out
    enc = tokenize_pairs(tokenizer, list(questions), list(passages), max_length, padding=False)
    order = sorted(range(len(questions)), key=lambda i: len(enc["input_ids"][i]), reverse=True)
    device = next(model.parameters()).device
    ctx = autocast_context(device, autocast)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                batch = tokenizer.pad([{k: v[i] for k, v in enc.items()} for i in rows], padding="longest",
                                      return_tensors="pt")
                with ctx:
                    logits = model(**{k: v.to(device) for k, v in batch.items()}).logits
                out[torch.tensor(rows)] = logits.float().squeeze(-1).cpu()
    finally:
        model.train(was_training)
    return out


def rerank_results(model: torch.nn.Module, tokenizer: Any, results: Sequence[Mapping[str, Any]], k: int,
                   settings: Mapping[str, Any], batch_size: int = 32, autocast: str = "auto") -> list[dict]:
    """Each question's first ``k`` ctxs reordered by the cross-encoder's logit (best first; equal logits
    keep the first stage's order), ``score`` replaced by the logit and the first stage's kept as
    ``first_stage_score`` / ``first_stage_rank``. Later ctxs are dropped: the list is the reranked top k."""
    questions, documents, spans = [], [], []
    for rec in results:
        ctxs = list(rec["ctxs"])[:k]
        spans.append((len(documents), len(ctxs)))
        questions += [rec["question"]] * len(ctxs)
        documents += [document_text(c["title"], c["text"], tokenizer, bool(settings["title"])) for c in ctxs]
    scores = score_pairs(model, tokenizer, questions, documents, batch_size=batch_size, autocast=autocast,
                         max_length=int(settings["max_length"])).tolist()
    out = []
    for rec, (start, n) in zip(results, spans):
        mine = scores[start:start + n]
        order = sorted(range(n), key=lambda j: (-mine[j], j))
        ctxs = [{**rec["ctxs"][j], "score": mine[j], "first_stage_score": rec["ctxs"][j]["score"],
                 "first_stage_rank": j} for j in order]
        out.append({**rec, "ctxs": ctxs})
    return out
