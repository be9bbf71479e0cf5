#!/usr/bin/env python
"""How much of a model's space its first ``d`` coordinates keep, against the first ``d`` of the PCA rotation that
``train.projection_init=pca`` starts from: dev top-k over the whole corpus (DPR's has_answer), per size.

    DPR_DATA_MIRROR=../shared/data .venv/bin/python scripts/pca_truncation.py --dims 192,96,48 --json pca.json
    .venv/bin/python scripts/pca_truncation.py --model runs/squad1_open/model --dims 96    # a trained model

The rotation is the one the trainer computes (`dpr.training.projection_init`: the training file's first 4,096
distinct passages through the passage tower, fp32, cosine models normalised; the second moment's eigenvectors);
the model's own vectors (its projection, if it has one, included) are then cut to ``d`` coordinates and
re-normalised (cosine), before and after the rotation. Exact search, fp32, 100 passages per question.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_data import find_dataset  # noqa: E402
from script_args import OneLineParser, json_output  # noqa: E402  (scripts/ is on sys.path)

REPO = Path(__file__).resolve().parents[1]
KS = (1, 5, 20, 100)


def topk_accuracy(q: torch.Tensor, p: torch.Tensor, hits: torch.Tensor, cosine: bool) -> list[float]:
    """Top-k accuracy (%) at :data:`KS` of questions ``q`` over passages ``p``; ``hits[i, j]``: passage j holds an
    answer of question i."""
    if cosine:
        q, p = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(p, dim=-1)
    top = (q @ p.T).topk(min(max(KS), p.shape[0]), dim=1).indices
    found = torch.gather(hits, 1, top)
    return [round(100 * float(found[:, :k].any(1).float().mean()), 1) for k in KS]


def main(argv: list[str] | None = None) -> dict:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="minilm",
                    help="a run's model directory, or a preset of conf/model/ (the untrained backbone with its settings)")
    ap.add_argument("--data-dir", type=Path, default=REPO / "data" / "prepared")
    ap.add_argument("--data", default="squad1_open")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--dims", default="192,96,48")
    ap.add_argument("--json", type=json_output, default=None)
    args = ap.parse_args(argv)
    dims = [int(d) for d in args.dims.split(",")]
    root = find_dataset(args.data_dir, args.data)

    with torch.no_grad():  # a scope, not set_grad_enabled(False): main() is also called in-process by tests
        return _measure(args, dims, root)


def _measure(args: argparse.Namespace, dims: list[int], root: Path) -> dict:
    from dpr.data.passages import iter_passages
    from dpr.data.qa import read_qa_tsv
    from dpr.eval.has_answer import has_answer
    from dpr.models import encode_texts, load_biencoder
    from dpr.models.truncate import truncate  # the one truncation rule (the loss's, encode.dim's, dense.dims')
    from dpr.training.batching import load_examples
    from dpr.training.projection_init import pca_rotation, sample_passages

    preset = REPO / "conf" / "model" / f"{args.model}.yaml"
    if preset.is_file() and not Path(args.model).is_dir():
        import yaml

        settings = yaml.safe_load(preset.read_text())
        model, tok = load_biencoder(settings.pop("name"), **settings)
    else:
        model, tok = load_biencoder(args.model)
    model.eval()
    cosine = model.config.similarity == "cosine"
    passages = list(iter_passages(root / "passages.tsv"))
    pairs = read_qa_tsv(root / f"{args.split}.qa.tsv")
    P = encode_texts(model, tok, [x["text"] for x in passages], "passage", titles=[x["title"] for x in passages],
                     autocast="off", progress=True)
    Q = encode_texts(model, tok, [x.question for x in pairs], "question", autocast="off", progress=True)
    hits = torch.tensor([[has_answer(x.answers, p["text"]) for p in passages] for x in pairs])
    titles, texts = sample_passages(load_examples(root / "train.json"))
    S = encode_texts(model, tok, texts, "passage", titles=titles, autocast="off", progress=True)
    rot, share = pca_rotation(torch.nn.functional.normalize(S, dim=-1) if cosine else S)
    rows = [{"dim": P.shape[1], "first": topk_accuracy(Q, P, hits, cosine), "rotated": None, "share": 1.0}]
    for d in dims:
        rows.append({"dim": d, "first": topk_accuracy(truncate(Q, d, cosine), truncate(P, d, cosine), hits, cosine),
                     "rotated": topk_accuracy(truncate(Q @ rot, d, cosine), truncate(P @ rot, d, cosine), hits, cosine),
                     "share": round(float(share[d - 1]), 4)})
    report = {"model": args.model, "data": str(root), "split": args.split, "questions": len(pairs),
              "passages": len(passages), "rotation_passages": len(texts), "ks": list(KS), "rows": rows}
    print(f"| size | first d coordinates, top-{'/'.join(map(str, KS))} | first d of the PCA rotation | share |")
    print("|---|---|---|---|")
    for r in rows:
        rot_cell = "-" if r["rotated"] is None else " / ".join(map(str, r["rotated"]))
        print(f"| {r['dim']} | {' / '.join(map(str, r['first']))} | {rot_cell} | {r['share']:.2f} |")
    if args.json:
        from dpr.atomic import write_json_atomic

        write_json_atomic(args.json, report)
    return report


if __name__ == "__main__":
    main()
