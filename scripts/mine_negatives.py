"""Mine a prepared dataset's training questions with BM25, a dense model or their hybrid into a new train file.

`dpr-bm25 mine=true` rewrites the dataset's own train.json with BM25's negatives; this writes a copy whose
``hard_negative_ctxs`` come from another miner, through the same false-negative filter (`dpr.negatives.mine`:
answer-bearing and judged passages are never negatives), for a cross-encoder or a dual encoder to train on:

    python scripts/mine_negatives.py --dataset data/prepared/squad1_open --miner hybrid \
        --model runs/squad1_open/model --index runs/squad1_open/dense/index.faiss \
        --weight runs/squad1_open/hybrid/weight.json --output runs/negatives/hybrid_train.json
    dpr-rerank train data=squad1_open train_file=runs/negatives/hybrid_train.json output_dir=...

The counts of each filter are written beside the output (``<stem>.stats.json``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from script_args import OneLineParser, json_output, output_of_kind, refuse, whole  # scripts/ is on sys.path


def _fusion(arg: str) -> tuple[float, str]:
    """The hybrid's ``(weight, normalize)``: a number (min-max normalised, as the pipeline's default), or the
    pipeline's ``<run>/hybrid/weight.json``, whose dev-tuned weight only means what it did with the normalisation
    it was tuned under (its ``normalize`` field, min-max where the file predates it)."""
    from dpr.retrieval.fusion import NORMALIZE

    path = Path(arg)
    if path.is_file():
        try:
            tuned = json.loads(path.read_text(encoding="utf-8"))
            weight = float(tuned["weight"])
        except (ValueError, KeyError, TypeError) as e:
            refuse(f"{path}: no numeric 'weight' field ({e})")
        normalize = tuned.get("normalize", "minmax")
        if normalize not in NORMALIZE:
            refuse(f"{path}: field 'normalize' must be one of {NORMALIZE}, got {normalize!r}")
        return weight, normalize
    try:
        return float(arg), "minmax"
    except ValueError:
        refuse(f"--weight {arg!r}: neither a number nor a weight.json file")


def _results(head: bytes) -> bool:
    from dpr.output_kinds import dpr_results

    return dpr_results(head)


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", required=True, help="a prepared dataset directory (passages.tsv, train.json)")
    p.add_argument("--split", default="train", help="which <split>.json to mine (default train)")
    p.add_argument("--miner", choices=("bm25", "dense", "hybrid"), required=True)
    p.add_argument("--model", help="dense/hybrid: the run directory (or model) whose question tower searches")
    p.add_argument("--index", help="dense/hybrid: the FAISS index of that model's passage vectors")
    p.add_argument("--weight", default="1.0", help="hybrid: dense + weight * bm25 (a number or a weight.json)")
    p.add_argument("--num-negatives", type=whole(0), default=30)
    p.add_argument("--depth", type=whole(1), default=100)
    p.add_argument("--output", required=True, type=output_of_kind(_results, "a DPR results JSON"),
                   help="the mined training set (a DPR results JSON: an earlier one is replaced, nothing else)")
    args = p.parse_args(argv)
    json_output(str(args.output.with_name(args.output.stem + ".stats.json")))  # its sidecar: the same rule
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    from dpr.atomic import write_json_atomic
    from dpr.data.dataset import DatasetPaths
    from dpr.data.retriever_json import read_retriever_json, write_retriever_json
    from dpr.negatives.mine import judged_from_dataset, mine_examples
    from dpr.retrieval.retriever import Retriever

    ds = DatasetPaths(args.dataset)
    source = Path(ds.root) / f"{args.split}.json"
    if not source.is_file():
        refuse(f"{source}: no such file (prepare the dataset with dpr-data)")
    if args.miner != "bm25" and not (args.model and args.index):
        refuse(f"--miner {args.miner} needs --model and --index")
    weight, normalize = _fusion(args.weight) if args.miner == "hybrid" else (None, None)
    bm25 = Retriever.bm25(ds.passages, Path(ds.root) / "bm25_index") if args.miner != "dense" else None
    dense = (Retriever.dense(args.model, args.index, passages=ds.passages) if args.miner != "bm25" else None)
    retriever = {"bm25": bm25, "dense": dense}.get(args.miner) or Retriever.hybrid(bm25, dense, weight,
                                                                                     normalize=normalize,
                                                                                     depth=args.depth)
    qrels = judged_from_dataset(ds) if ds.kind == "qrels" else None
    mined, counts = mine_examples(retriever, read_retriever_json(source), num_negatives=args.num_negatives,
                                  depth=args.depth, qrels=qrels, end_at_score=0.0 if args.miner == "bm25" else None)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_retriever_json(out, mined)
    stats = {"miner": args.miner, "source": str(source), "model": args.model, "index": args.index,
             "weight": weight, "normalize": normalize,
             "num_negatives": args.num_negatives, "depth": args.depth, "counts": dict(counts)}
    write_json_atomic(out.with_name(out.stem + ".stats.json"), stats)
    logging.info("wrote %s (%d questions): %s", out, len(mined), dict(counts))


if __name__ == "__main__":
    main()
