"""One rank of tests/training/test_corpus_shards.py (run under torchrun, gloo): a sampled corpus encoded in shares,
then a short training run with frozen-index steps on a sample, each rank reading its training file streamed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dpr import distributed as dist  # noqa: E402

TEXTS = [f"passage {i} about topic {i % 5} and its many words" for i in range(11)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_distributed()
    import dpr.models.inference as inference
    from dpr.models import load_biencoder
    from dpr.training.corpus_negatives import CorpusNegatives
    from dpr.training.train import train

    encoded = []
    real = inference.encode_texts

    def counting(model, tok, texts, *a, **k):
        encoded.append(len(texts))
        return real(model, tok, texts, *a, **k)

    inference.encode_texts = counting
    model, tok = load_biencoder(args.model_dir, pooling="mean", passage_max_length=32)
    corpus = CorpusNegatives([f"d{i}" for i in range(11)], TEXTS, [""] * 11, positions=list(range(11)))
    corpus.refresh(model, tok, step=0, batch_size=4, max_length=32, autocast="off")
    inference.encode_texts = real
    out = Path(args.out)
    summary = train({"model": {"name": args.model_dir, "pooling": "mean", "question_max_length": 32,
                               "passage_max_length": 64},
                     "data": {"name": "tiny", "kind": "qa"}, "logger": {"type": "none"}, "seed": 7,
                     "train": {"batch_size": 2, "hard_negatives": 1, "max_steps": 1, "frozen_steps": 2,
                               "corpus_sample": 8, "validate": False, "save_every": 0, "precision": "fp32",
                               "lr": 1e-3, "warmup_ratio": 0.0},
                     "data_dir": args.data_dir, "output_dir": str(out / "run")})
    (out / f"rank{dist.rank()}.json").write_text(json.dumps({
        "encoded": encoded, "vectors": corpus.vectors.tolist(), "steps": summary["steps"],
        "world": summary["world_size"]}))
    dist.barrier()
    dist.cleanup()


if __name__ == "__main__":
    main()
