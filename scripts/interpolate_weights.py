#!/usr/bin/env python
"""Dev figures of weights interpolated between the start model and a trained run (WiSE-FT, a model soup of two).

    .venv/bin/python scripts/interpolate_weights.py --model runs/squad1_open/model \\
        --data-dir data/prepared --data squad1_open --alphas 1,0.85,0.7,0.5 --out runs/interpolate_squad.json

For each ``alpha``, every floating-point weight is ``alpha * trained + (1 - alpha) * start`` (the start is
the pretrained encoder the run's ``biencoder.json`` names, both towers), and the trainer's own validation
(``dpr.training.validation.validate``: dev average rank and MRR over DPR's pool, top-k over the corpus) scores
it, so ``alpha = 1`` reproduces the run's last ``validation.jsonl`` line. Weight interpolation often keeps a
fine-tuned model's gains while recovering the start model's breadth (Wortsman et al. 2022); this measures
whether it does here. Output: ``{"model", "data", "rows": [{"alpha", <metrics>, "seconds"}]}`` and one line per
alpha on stdout.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from dpr.atomic import write_json_atomic  # noqa: E402
from script_args import OneLineParser, comma_list, json_output, real  # noqa: E402  (scripts/ is on sys.path)

SHOWN = ("top1", "top5", "top20", "mrr", "avg_rank")


def interpolate(trained: dict[str, torch.Tensor], start: dict[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    """``alpha * trained + (1 - alpha) * start`` for floating-point tensors (fresh tensors: the inputs are
    never written); integer buffers (position ids) are taken from ``trained``."""
    if trained.keys() != start.keys():
        raise ValueError(f"the two models differ in their weights: {sorted(trained.keys() ^ start.keys())[:5]}")
    return {k: torch.lerp(start[k].float(), v.float(), alpha).to(v.dtype) if v.is_floating_point() else v.clone()
            for k, v in trained.items()}


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a trained run's model directory (holds biencoder.json)")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--data", default="squad1_open")
    ap.add_argument("--alphas", type=comma_list(real(0, 1)), default=[1.0, 0.85, 0.7, 0.5],
                    help="comma list of weights in [0, 1] of the trained model (1: trained, 0: untrained)")
    ap.add_argument("--autocast", default="off", help="off (fp32) or bf16")
    ap.add_argument("--out", required=True, type=json_output)
    args = ap.parse_args(argv)

    from dpr.data.dataset import DatasetPaths
    from dpr.training.batching import load_examples
    from dpr.models.io import build_biencoder, load_biencoder, read_biencoder_config
    from dpr.run_dir import finished_config
    from dpr.training.validation import DevEncoding, load_corpus, validate

    torch.manual_seed(0)
    model, tokenizer = load_biencoder(args.model)
    # a copy: loading each interpolation writes into the model's own tensors
    trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
    start = build_biencoder(read_biencoder_config(args.model))[0].state_dict()
    # the run's own validation settings (dev subset, pool size, k), so alpha = 1 reproduces its validation
    run_train = (finished_config(args.model) or {}).get("train") or {}
    val_cfg = {k: v for k, v in run_train.items() if k.startswith("val_")}
    paths = DatasetPaths(Path(args.data_dir) / args.data)
    dev = load_examples(paths.dev)
    corpus = (load_corpus(paths.passages, int(val_cfg.get("val_corpus_max_passages", 0)))
              if val_cfg.get("val_corpus_topk", True) else None)  # as the trainer's validator
    use_answers = paths.kind == "qa"  # as the trainer decides: answers for QA data, positives for qrels data
    mcfg = model.config
    rows = []
    for alpha in args.alphas:
        model.load_state_dict(interpolate(trained, start, alpha))
        t0 = time.perf_counter()
        metrics = validate(model, tokenizer, dev, corpus=corpus, use_answers=use_answers, cfg=val_cfg,
                           encoding=DevEncoding(question_max_length=mcfg.question_max_length,
                                                passage_max_length=mcfg.passage_max_length, autocast=args.autocast))
        rows.append({"alpha": alpha, **metrics, "seconds": round(time.perf_counter() - t0, 1)})
        print(json.dumps({"alpha": alpha, **{k: round(metrics[k], 4) for k in SHOWN if k in metrics}}), flush=True)
    write_json_atomic(args.out, {"model": str(args.model), "data": args.data, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
