"""One rank of the 2-process test (tests/system/test_distributed.py); run under torchrun.

Each rank takes its slice of a fixed global batch, runs the plain step and the gradient-cache step
through DistributedDataParallel (gloo, CPU, dropout off), and saves the averaged gradients and
loss figures to ``<out>/rank<r>_<step>.safetensors`` / ``.json`` for the test to compare against
one process holding the whole global batch. It also exercises the gather helpers with unequal
per-rank sizes.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

QUESTIONS = ["capital of hawaii", "what makes atp in cells", "highest mountain on earth", "largest ocean"]
PASSAGES = [  # pos_i, hn_i per question (H = 1)
    "Honolulu is the capital of Hawaii.",
    "Paris is the capital of France.",
    "The mitochondria is the powerhouse of the cell, producing ATP.",
    "Photosynthesis converts light energy.",
    "Mount Everest is Earth's highest mountain above sea level.",
    "Berlin",
    "The Pacific Ocean is the largest and deepest of Earth's oceans, covering a third of the surface.",
    "Water boils at 100 degrees.",
]
PER_Q = 2
MODEL_KW = dict(projection_dim=8, similarity="cosine", temperature=0.1)
# --lora (tests/models/test_lora_ddp.py): a decoder with LoRA adapters, last-token pooling
LORA_KW = dict(pooling="last", lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]})
# Each loss runs through the same steps; hinge is the non-default one whose equalities must hold too.
LOSSES = {"softmax_nll": {"_target_": "dpr.losses.SoftmaxNLLLoss"},
          "symmetric_nll": {"_target_": "dpr.losses.SymmetricSoftmaxNLLLoss", "passage_weight": 0.7},
          "hinge": {"_target_": "dpr.losses.HingeLoss", "margin": 0.5},
          "kl_distill": {"_target_": "dpr.losses.KLDistillLoss", "nll_weight": 0.5, "teacher_temperature": 2.0,
                         "student_temperature": 0.5},
          "margin_mse": {"_target_": "dpr.losses.MarginMSELoss", "teacher_scale": 0.5}}
NAN = float("nan")
# A teacher's scores of every (question, pool passage) pair; NaN = not scored. Rank 1's questions score
# rank 0's passages and the other way round, so a rank must see the scores of the global pool's columns.
TEACHER = [[5.0, 1.0, 2.0, 0.5, NAN, 3.0, NAN, 0.0],
           [NAN, 2.0, 6.0, 1.0, 0.5, NAN, 4.0, NAN],
           [1.0, NAN, 0.0, 2.5, 7.0, 1.5, NAN, 3.0],
           [3.5, 0.0, NAN, 1.0, 2.0, NAN, 8.0, 1.0]]


def global_masks():
    """Question i's positive is passage 2i; two false negatives masked (question 0 <-> passage 3 and
    question 3 <-> passage 0), so the masks' rows must follow each rank's questions; the teacher's
    scores (for the distillation losses) travel in the same rows."""
    from dpr.losses import PairMasks

    m = PairMasks.dpr_layout(len(QUESTIONS), PER_Q)
    m.ignore[0, 3] = True
    m.ignore[3, 0] = True
    m.teacher = torch.tensor(TEACHER)
    return m


def rank_masks(rank: int, world: int):
    from dpr.losses import PairMasks

    m, nq = global_masks(), len(QUESTIONS) // world
    rows = slice(rank * nq, (rank + 1) * nq)
    return PairMasks(m.positive[rows], m.ignore[rows], m.teacher[rows])


def build(model_dir: str, lora: bool = False):
    from dpr.models import BiEncoderConfig, build_biencoder

    torch.manual_seed(0)
    model, tok = build_biencoder(BiEncoderConfig(name=model_dir, **MODEL_KW, **(LORA_KW if lora else {})))
    model.eval()  # dropout off: ranks and the reference must compute the same function
    return model, tok


def batch(tok, questions, passages):
    q = dict(tok(questions, padding="longest", return_tensors="pt"))
    p = dict(tok(passages, padding="longest", return_tensors="pt"))
    return q, p


def grads_of(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.detach().clone().contiguous() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--gather-only", action="store_true", help="only the gather helpers (tests/system/test_slurm.py)")
    args = ap.parse_args()

    from torch.nn.parallel import DistributedDataParallel as DDP

    from dpr import distributed as D
    from dpr.losses import build_loss
    from dpr.training.grad_cache import grad_cache_step
    from dpr.training.steps import standard_step

    assert D.init_distributed() and D.is_distributed()
    r, w = D.rank(), D.world_size()
    out = Path(args.out_dir)
    if args.gather_only:
        gather_checks(out, r)
        return

    model, tok = build(args.model_dir, args.lora)
    ddp = DDP(model)
    nq = len(QUESTIONS) // w
    q, p = batch(tok, QUESTIONS[r * nq : (r + 1) * nq], PASSAGES[r * nq * PER_Q : (r + 1) * nq * PER_Q])

    masks = rank_masks(r, w)
    for loss_name, loss_cfg in LOSSES.items():
        loss = build_loss(loss_cfg)

        def loss_fn(qv, pv, loss=loss):
            return loss(qv, pv, masks, model.similarity)

        for name, step in (
            ("standard", lambda: standard_step(ddp, q, p, loss_fn)),
            ("cache", lambda: grad_cache_step(ddp, q, p, loss_fn, chunk_size=1)),
        ):
            res = step()
            save_file(grads_of(model), str(out / f"rank{r}_{loss_name}_{name}.safetensors"))
            figures = dict(loss=res.loss.item(), accuracy=float(res.accuracy), avg_rank=float(res.avg_rank), n=res.num_candidates)
            (out / f"rank{r}_{loss_name}_{name}.json").write_text(json.dumps(figures))
    gather_checks(out, r)


def gather_checks(out: Path, r: int) -> None:
    """The gather helpers with unequal per-rank sizes, and the variables the launcher gave this rank."""
    from dpr import distributed as D

    # Unequal sizes: rank r contributes r + 1 rows of value r; every rank's loss is sum(weights * gathered).
    local = torch.full((r + 1, 3), float(r), requires_grad=True)
    gathered = D.all_gather_with_grad(local)
    weights = torch.arange(gathered.numel(), dtype=torch.float32).reshape(gathered.shape)
    (weights * gathered).sum().backward()
    gather = dict(
        gathered=gathered.detach().tolist(),
        local_grad=local.grad.tolist(),
        objects=D.all_gather_object({"rank": r}),
        mean=D.reduce_mean(float(r)),
        env_world=int(os.environ["WORLD_SIZE"]),
        env={k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")},
    )
    (out / f"rank{r}_gather.json").write_text(json.dumps(gather))
    D.barrier()
    D.cleanup()


if __name__ == "__main__":
    main()
