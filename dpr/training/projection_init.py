"""``train.projection_init=pca``: the projection starts as the rotation that orders the vectors' coordinates by
how much of the passages they carry, so that a prefix of them (Matryoshka sizes, ``dense.dim``) starts from the
best linear cut of the model's space instead of the backbone's arbitrary first coordinates.

Before the first step, a sample of the training passages is encoded by the passage tower up to its pooling
(the projection's input, fp32, eval mode); for a cosine model each vector is normalised first, since only
directions are scored. The eigenvectors of their second moment ``VᵀV / n`` (not centred: the projection has no
shift to undo, and its bias starts at 0), by decreasing eigenvalue, give ``R``; every projection (one, or one
per tower: both the same) gets ``weight = R[:, :d]ᵀ``, ``bias = 0``. With ``d`` = the hidden size the projection
is a rotation: every score of the model is what it was (cosine and dot product are rotation-invariant), only the
order of the coordinates changed; with ``d`` smaller it is PCA's best ``d``-dimensional linear cut.

Untrained all-MiniLM-L6-v2 on squad1_open dev, top-20 at 96 of 384 dimensions: the first 96 coordinates 90.6,
the rotation's first 96 93.4 (all 384: 95.8; ``scripts/pca_truncation.py``, ``docs/backbones.md``).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch
from torch import nn

log = logging.getLogger(__name__)

PROJECTION_INITS = ("pca",)
MAX_PASSAGES = 4096  # enough for a 384 x 384 second moment; the sample is the file's first distinct passages


def sample_passages(examples: Sequence[dict], limit: int = MAX_PASSAGES) -> tuple[list[str], list[str]]:
    """The first ``limit`` distinct passages (positives, then hard negatives, example by example) as
    ``(titles, texts)``: deterministic, the training file's order."""
    seen: dict[Any, tuple[str, str]] = {}
    for ex in examples:
        for key in ("positive_ctxs", "hard_negative_ctxs"):
            for ctx in ex.get(key) or ():
                pid = ctx.get("passage_id") or (ctx.get("title"), ctx["text"])
                if pid not in seen:
                    seen[pid] = (ctx.get("title") or "", ctx["text"])
                    if len(seen) >= limit:
                        return [t for t, _ in seen.values()], [x for _, x in seen.values()]
    return [t for t, _ in seen.values()], [x for _, x in seen.values()]


def pca_rotation(vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n, H]`` -> ``(R [H, H], share [H])``: the eigenvectors of the second moment by decreasing eigenvalue
    (columns; each signed so that its largest coordinate is positive: one answer, whatever the solver), and the
    cumulative share of the second moment the first ``k`` of them carry."""
    v = vectors.double()
    evals, evecs = torch.linalg.eigh(v.T @ v / max(1, v.shape[0]))
    evals, evecs = evals.flip(0).clamp_min(0), evecs.flip(1)
    rows = evecs.abs().argmax(dim=0)
    evecs = evecs * torch.sign(evecs[rows, torch.arange(evecs.shape[1])]).unsqueeze(0)
    return evecs.float(), (evals.cumsum(0) / evals.sum().clamp_min(1e-30)).float()


def projections(model: nn.Module) -> list[nn.Linear]:
    """The model's distinct projections (one when the towers are shared)."""
    found = [model.question_projection, model.passage_projection]
    return list({id(p): p for p in found if p is not None}.values())


@torch.no_grad()
def init_projection_pca(model: nn.Module, tokenizer: Any, examples: Sequence[dict], *,
                        device: torch.device | str, limit: int = MAX_PASSAGES) -> dict:
    """Set every projection of ``model`` (a :class:`~dpr.models.BiEncoder` with ``projection_dim``) from the
    training passages' principal directions (module docstring). Returns what it did, for the log and the run."""
    from dpr.models import encode_texts

    projs = projections(model)
    if not projs:
        raise ValueError("train.projection_init=pca needs a projection: set model.projection_dim (e.g. the model's "
                         f"size, {model.hidden_size}, for a rotation)")
    dim = projs[0].out_features
    if dim > model.hidden_size:
        raise ValueError(f"train.projection_init=pca: model.projection_dim={dim} is larger than the backbone's "
                         f"{model.hidden_size} dimensions (PCA gives at most that many directions)")
    titles, texts = sample_passages(examples, limit)
    if len(texts) < 2:
        raise ValueError(f"train.projection_init=pca needs passages to measure: the training data has {len(texts)}")
    pooled: list[torch.Tensor] = []
    hook = model.passage_projection.register_forward_pre_hook(lambda _m, args: pooled.append(args[0].float().cpu()))
    was_training = model.training
    model.eval()
    try:
        encode_texts(model, tokenizer, texts, "passage", titles=titles, device=device, autocast="off",
                     progress=True)
    finally:
        hook.remove()
        model.train(was_training)
    vecs = torch.cat(pooled)
    if model.config.similarity == "cosine":
        vecs = nn.functional.normalize(vecs, dim=-1)
    rot, share = pca_rotation(vecs)
    for proj in projs:
        proj.weight.copy_(rot[:, :dim].T.to(proj.weight))
        if proj.bias is not None:
            proj.bias.zero_()
    info = {"passages": len(texts), "dim": dim, "share_at": {d: round(float(share[d - 1]), 4)
                                                             for d in sorted({dim, 192, 96, 48}) if d <= dim}}
    log.info("projection_init=pca: %d passages, projection %d x %d; second-moment share carried by the first "
             "d coordinates: %s", len(texts), model.hidden_size, dim, info["share_at"])
    return info
