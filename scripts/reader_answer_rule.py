#!/usr/bin/env python
"""Choose the reader's answer rule on dev: read once, score every (span_score, passage_weight, rank_weight).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/reader_answer_rule.py --model runs/reader/squad1_open \\
        --data-dir data/prepared --data squad1_open --split dev \\
        --results runs/squad1_open/bm25/dev.json --out runs/reader/answer_rule_dev.json

Each (question, passage) pair is read once (gold passages of ``--split`` and the top ``max(--ks)`` of
``--results``); the rules only re-rank the stored window readings, so the whole grid costs one reading.
Output: ``{"rules": [{"span_score", "passage_weight", "rank_weight", "gold": {"em", "f1"}, "open_domain": {"<k>": {"em",
"f1"}}}], "top_k": {"<k>": bound}, "num_questions", "seconds"}`` (fractions) and a table on stdout.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dpr.atomic import write_json_atomic  # noqa: E402
from script_args import OneLineParser, comma_list, json_output, real, whole  # noqa: E402  (scripts/ is on sys.path)


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a trained reader (dpr-reader train output_dir)")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--data", default="squad1_open")
    ap.add_argument("--split", default="dev", help="gold passages of this split")
    ap.add_argument("--results", required=True, help="DPR results JSON of the same split")
    ap.add_argument("--ks", type=comma_list(whole(1)), default=[1, 5, 20])
    ap.add_argument("--weights", type=comma_list(real(0)), default=[0, 0.5, 1, 2, 4, 1000],
                    help="passage_weight values")
    ap.add_argument("--rank-weights", type=comma_list(real(0)), default=[0, 1, 2, 4],
                    help="rank_weight values (the retriever-order prior)")
    ap.add_argument("--max-questions", type=whole(0), default=0, help="open domain: the first N questions only")
    ap.add_argument("--out", required=True, type=json_output)
    args = ap.parse_args(argv)

    from dpr.data.dataset import DatasetPaths
    from dpr.data.results import read_results
    from dpr.eval.topk import first_hit_ranks
    from dpr.reader.evaluate import limit
    from dpr.reader.gold import gold_records
    from dpr.reader.infer import SPAN_SCORES, AnswerRule
    from dpr.reader.model import load_reader
    from dpr.reader.open_domain import answer_at_k, read_records
    from dpr.reader.squad_metrics import evaluate

    t0 = time.perf_counter()
    ks = args.ks
    model, tok, settings = load_reader(args.model)
    gold, _ = gold_records(DatasetPaths(Path(args.data_dir) / args.data), args.split)
    depth = max(len(r["ctxs"]) for r in gold)
    gold_read = read_records(model, tok, settings, gold, depth)
    records = limit(read_results(args.results), args.max_questions)
    open_read = read_records(model, tok, settings, records, max(ks))
    ranks = first_hit_ranks(records, max_k=max(ks))
    rules = []
    for span_score in SPAN_SCORES:
        for w in args.weights:
            # gold passages have no retriever order: no rank prior there
            gold_fig = evaluate(answer_at_k(gold_read, depth, AnswerRule(span_score, w)), [r["answers"] for r in gold])
            for rw in args.rank_weights:
                rule = AnswerRule(span_score, w, rw)
                row = {"span_score": span_score, "passage_weight": w, "rank_weight": rw, "gold": gold_fig,
                       "open_domain": {str(k): evaluate(answer_at_k(open_read, k, rule), [r["answers"] for r in records])
                                       for k in ks}}
                rules.append(row)
                print(f"{span_score:8s} w={w:<6g} rank_w={rw:<4g} gold EM/F1 {100 * gold_fig['em']:.1f}/"
                      f"{100 * gold_fig['f1']:.1f}  "
                      + "  ".join(f"k={k} EM {100 * row['open_domain'][str(k)]['em']:.1f}" for k in ks), flush=True)
    out = {"model": args.model, "results": args.results, "num_questions": len(records), "num_gold_questions": len(gold),
           "top_k": {str(k): float((ranks < k).mean()) for k in ks}, "rules": rules,
           "seconds": round(time.perf_counter() - t0, 1)}
    write_json_atomic(Path(args.out), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
