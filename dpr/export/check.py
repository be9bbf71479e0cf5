"""Does an export compute what the project computes? Vectors side by side, and the top-k they give."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np


def _st_inputs(texts: Sequence[str], titles: Sequence[str] | None) -> list:
    # (title, text) pairs as the project tokenizes them; a passage without a title is its text alone
    if titles is None:
        return list(texts)
    return [(t, x) if t else x for x, t in zip(texts, titles)]


def compare_export(run_dir: str | Path, export_dir: str | Path, questions: Sequence[str], passages: Sequence[str],
                   titles: Sequence[str] | None = None, k: int = 20, batch_size: int = 32) -> dict[str, Any]:
    """Encode with the run (`dpr.models.encode_texts`, fp32) and with ``SentenceTransformer(export_dir)``
    (``encode_query`` / ``encode_document``); return the smallest cosine between the two vectors of a
    text, and how many questions get the same top-``k`` passages (as sets, and in the same order)."""
    from sentence_transformers import SentenceTransformer

    from dpr.models import encode_texts, load_biencoder

    from dpr.models.truncate import truncate

    model, tok = load_biencoder(str(run_dir))
    st = SentenceTransformer(str(export_dir), device="cpu", local_files_only=True)
    # an export with a Matryoshka truncate_dim: dpr's vectors cut by its rule, the export's re-normalised to match
    dim, cosine = st.truncate_dim, model.config.similarity == "cosine"
    ours_q = truncate(encode_texts(model, tok, questions, "question", batch_size=batch_size, autocast="off"), dim,
                      cosine).numpy()
    ours_p = truncate(encode_texts(model, tok, passages, "passage", batch_size=batch_size, autocast="off",
                                   titles=titles), dim, cosine).numpy()
    norm = {"normalize_embeddings": True} if dim and cosine else {}
    st_q = np.asarray(st.encode_query(list(questions), batch_size=batch_size, convert_to_numpy=True, **norm))
    st_p = np.asarray(st.encode_document(_st_inputs(passages, titles), batch_size=batch_size, convert_to_numpy=True,
                                         **norm))

    def cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)

    k = min(k, len(passages))
    top_ours = np.argsort(-(ours_q @ ours_p.T), axis=1, kind="stable")[:, :k]
    top_st = np.argsort(-(st_q @ st_p.T), axis=1, kind="stable")[:, :k]
    same_set = sum(set(a) == set(b) for a, b in zip(top_ours.tolist(), top_st.tolist()))
    same_order = int((top_ours == top_st).all(axis=1).sum())
    return {
        "questions": len(questions), "passages": len(passages), "k": k,
        "min_cosine_questions": float(cos(ours_q, st_q).min()),
        "min_cosine_passages": float(cos(ours_p, st_p).min()),
        "max_abs_diff": float(max(np.abs(ours_q - st_q).max(), np.abs(ours_p - st_p).max())),
        "same_topk_set": same_set, "same_topk_order": same_order,
    }
