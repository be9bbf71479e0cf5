#!/usr/bin/env python
"""The sentence-transformers export against the project's own vectors, on real questions and passages.

    .venv/bin/python scripts/check_export.py --run runs/squad1_open/model \
        --qa data/prepared/squad1_open/test.qa.tsv --passages data/prepared/squad1_open/passages.tsv
    .venv/bin/python scripts/check_export.py --make separate-projection ...   # no trained run at hand

``--make shared`` saves all-MiniLM-L6-v2 with the default model config (one tower, mean pooling,
cosine); ``--make separate-projection`` two towers (the passage tower perturbed, as training would
leave it) with a seeded 128-d projection, CLS pooling and cosine. The run is exported with
`dpr.export.export_sentence_transformers`, then `dpr.export.compare_export` encodes the first
``--questions`` questions and every passage (titles as pairs) both ways in fp32 and prints the
smallest cosine between the two vectors of a text and how many questions get the same top-20.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from script_args import OneLineParser, input_dir, input_file, whole  # scripts/ is on sys.path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_run(kind: str, out: Path) -> Path:
    import torch

    from dpr.models import BiEncoderConfig, build_biencoder, save_biencoder

    torch.manual_seed(0)
    if kind == "shared":
        cfg = BiEncoderConfig(name="all-MiniLM-L6-v2", shared=True, pooling="mean", similarity="cosine",
                              temperature=0.05, question_max_length=64, passage_max_length=192)
    else:
        cfg = BiEncoderConfig(name="all-MiniLM-L6-v2", shared=False, pooling="cls", similarity="cosine",
                              projection_dim=128, question_max_length=64, passage_max_length=192)
    model, tok = build_biencoder(cfg)
    if not cfg.shared:
        with torch.no_grad():
            for p in model.passage_encoder.parameters():
                p.add_(0.01 * torch.randn_like(p))
    save_biencoder(model, tok, out)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=input_dir, help="a trained run directory")
    ap.add_argument("--make", choices=["shared", "separate-projection"], help="build a run from all-MiniLM-L6-v2")
    ap.add_argument("--qa", type=input_file, required=True)
    ap.add_argument("--passages", type=input_file, required=True)
    ap.add_argument("--questions", type=whole(1), default=500)
    ap.add_argument("--k", type=whole(1), default=20)
    args = ap.parse_args(argv)
    if (args.run is None) == (args.make is None):
        ap.error("give --run or --make")

    from dpr.data.passages import iter_passages
    from dpr.export import compare_export, export_sentence_transformers
    from dpr.data.questions import read_questions

    tmp = Path(tempfile.mkdtemp(prefix="check_export_"))
    run = args.run or make_run(args.make, tmp / "run")
    export = export_sentence_transformers(run, tmp / "st")
    questions = [q for q, _ in read_questions(args.qa)][: args.questions]
    rows = list(iter_passages(args.passages))
    figures = compare_export(run, export, questions, [r["text"] for r in rows], titles=[r["title"] for r in rows],
                             k=args.k)
    print(json.dumps({"run": str(args.run or args.make), **figures}, indent=1))


if __name__ == "__main__":
    main()
