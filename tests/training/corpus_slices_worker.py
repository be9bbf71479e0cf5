"""One rank of tests/training/test_corpus_slices.py (run under torchrun, gloo): a sampled corpus held in slices across
ranks against the same corpus with every vector on every rank: one step's candidates, loss and gradients, the slice
each rank keeps, and two short training runs (frozen-index steps, validation) that must log the same numbers."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from dpr import distributed as dist  # noqa: E402

N, DIM, TOPK = 37, 8, 5
QUESTIONS_PER_RANK = (4, 3)  # ranks' batches differ in size


def _questions(rank: int) -> list[dict]:
    # rank r's questions name passages r, r + 5, ... as positives; question 0 of each rank answers "topic 2"
    return [{"question": f"q{rank}-{i}", "positive_ids": frozenset({f"d{(rank + 5 * i) % N}"}),
             "target_id": f"d{(rank + 5 * i) % N}", "answers": ["topic 2"] if i == 0 else []}
            for i in range(QUESTIONS_PER_RANK[rank])]


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b.T


def _step(corpus, q0: torch.Tensor, questions: list[dict]) -> dict:
    from dpr.losses.softmax_nll import SoftmaxNLLLoss

    q = q0.clone().requires_grad_(True)
    cands = corpus.extra(q, questions)
    out = SoftmaxNLLLoss()(q, cands.vectors, cands.masks, _dot, gather=False)
    out.loss.backward()
    return {"ids": cands.ids, "targets": cands.targets, "vectors": cands.vectors.tolist(),
            "positive": cands.masks.positive.tolist(), "ignore": cands.masks.ignore.tolist(),
            "loss": float(out.loss), "grad": q.grad.tolist()}


def one_step(rank: int) -> dict:
    """The same step with the corpus in slices and with every vector here."""
    from dpr.training.corpus_negatives import CorpusNegatives

    gen = torch.Generator().manual_seed(0)
    vectors = torch.randn(N, DIM, generator=gen)  # the same on every rank: the whole corpus, as if encoded
    q = torch.randn(sum(QUESTIONS_PER_RANK), DIM, generator=gen)
    start = sum(QUESTIONS_PER_RANK[:rank])
    mine = q[start:start + QUESTIONS_PER_RANK[rank]]
    texts = [f"passage {i} about topic {i % 5}" for i in range(N)]
    made = {}
    for name, slicing in (("sliced", True), ("whole", False)):
        corpus = CorpusNegatives([f"d{i}" for i in range(N)], texts, [""] * N, positions=list(range(N)),
                                 max_corpus=0, topk=TOPK, checkpointed=False)
        corpus.slicing = slicing
        corpus.set_vectors(vectors, step=0)
        made[name] = {"sharded": corpus.sharded, "rows": corpus.vectors.shape[0],
                      "slice_equal": torch.equal(corpus.vectors, vectors[rank::2] if corpus.sharded else vectors),
                      "gathered_equal": torch.equal(corpus.whole_vectors(), vectors),
                      **_step(corpus, mine, _questions(rank))}
    return made


def encoded_slice(model_dir: str) -> dict:
    """A refresh that encodes this rank's rows keeps them (no gather), the same vectors as encoding every row."""
    from dpr.models import load_biencoder
    from dpr.training.corpus_negatives import CorpusNegatives

    model, tok = load_biencoder(model_dir, pooling="mean", passage_max_length=32)
    texts = [f"passage {i} about topic {i % 5} and its many words" for i in range(11)]
    kw = dict(positions=list(range(11)), max_corpus=0, checkpointed=False)
    sliced = CorpusNegatives([f"d{i}" for i in range(11)], texts, [""] * 11, **kw)
    whole = CorpusNegatives([f"d{i}" for i in range(11)], texts, [""] * 11, **kw)
    whole.slicing = False
    for c in (sliced, whole):
        c.refresh(model, tok, step=0, batch_size=4, max_length=32, autocast="off")
    return {"rows": sliced.vectors.shape[0], "whole_rows": whole.vectors.shape[0],
            "max_diff": float((sliced.vectors - whole.vectors[dist.rank()::2]).abs().max())}


def training(model_dir: str, data_dir: str, out: Path) -> dict:
    """Two runs on the same data, the sampled corpus in slices and whole: their logged numbers."""
    import dpr.training.train as train_mod
    from dpr.training.corpus_negatives import CorpusNegatives

    runs = {}
    for name, slicing in (("sliced", True), ("whole", False)):
        made, gathered = [], []

        def making(*a, _slicing=slicing, **k):
            corpus = CorpusNegatives(*a, **k)
            corpus.slicing = _slicing
            whole = corpus.whole_vectors

            def counted():  # validation reusing the cached corpus asks for every row
                gathered.append(whole())
                return gathered[-1]

            corpus.whole_vectors = counted
            made.append(corpus)
            return corpus

        train_mod.CorpusNegatives = making
        try:
            summary = train_mod.train({
                "model": {"name": model_dir, "pooling": "mean", "question_max_length": 32, "passage_max_length": 64},
                "data": {"name": "tiny", "kind": "qa"}, "logger": {"type": "none"}, "seed": 7,
                "train": {"batch_size": 2, "hard_negatives": 1, "max_steps": 1, "frozen_steps": 3,
                          "corpus_sample": 8, "corpus_max_passages": 0, "corpus_topk": 3, "validate": True,
                          "eval_every": 2, "save_every": 0, "precision": "fp32", "lr": 1e-3, "warmup_ratio": 0.0},
                "data_dir": data_dir, "output_dir": str(out / name)})
        finally:
            train_mod.CorpusNegatives = CorpusNegatives
        rows = [json.loads(line) for log in ("metrics.jsonl", "validation.jsonl")
                for line in (out / name / log).read_text().splitlines()]
        runs[name] = {"sharded": made[0].sharded, "rows": made[0].vectors.shape[0], "steps": summary["steps"],
                      "reused_rows": [v.shape[0] for v in gathered if v is not None],
                      "logged": [{k: v for k, v in r.items() if "loss" in k or "acc" in k or "mrr" in k
                                  or "top" in k or "rank" in k} for r in rows]}
    return runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_distributed()
    out = Path(args.out)
    result = {"world": dist.world_size(), "step": one_step(dist.rank()), "encoded": encoded_slice(args.model_dir),
              "training": training(args.model_dir, args.data_dir, out)}
    (out / f"rank{dist.rank()}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.cleanup()


if __name__ == "__main__":
    main()
