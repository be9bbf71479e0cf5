#!/usr/bin/env python
"""Transfer matrix: retrievers trained on one dataset, evaluated on every dataset's test questions and corpus.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/transfer_matrix.py --data-dir data/prepared \\
        --datasets squad1_open sciq_open nfcorpus \\
        --run squad1_open=runs/squad1_open/model --run sciq_open=runs/sciq_open/model \\
        --out runs/transfer

A score on one benchmark says little about another: SQuAD's questions were written looking at the
passage (they share its words), SciQ's and NFCorpus' were not. Rows: BM25, the untrained model
(``--untrained-config``, all-MiniLM-L6-v2 by default) and each ``--run NAME=RUN_DIR`` (a `dpr-train`
output); columns: the datasets. Cells: top-20 accuracy for QA data, nDCG@10 for qrels data (in %);
``*`` marks a model evaluated on the dataset it was trained on. Everything goes through the project's
own stages (`dpr.bm25`, `dpr.encode`, `dpr.index`, `dpr.retrieval`, `dpr.eval.report`), so each
dataset also gets its full report in ``<out>/<dataset>/eval/``; finished stages are skipped on rerun.

Output: ``<out>/transfer.json`` and ``<out>/transfer.md``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dpr.atomic import write_json_atomic, write_text_atomic  # noqa: E402
from dpr.data.dataset import DatasetPaths  # noqa: E402
from dpr.stages import StageRunner  # noqa: E402
from script_args import OneLineParser, claim_dir, owned_dir, whole  # noqa: E402  (scripts/ is on sys.path)

MARKER = ".dpr-transfer"  # a matrix's --out: a rerun may write there

log = logging.getLogger("transfer_matrix")
QA_METRIC, QRELS_METRIC = "top-20", "ndcg@10"


def parse_runs(items: Sequence[str]) -> dict[str, Path]:
    """``NAME=DIR`` pairs (NAME: the dataset the model was trained on) → ``{NAME: DIR}``."""
    runs: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--run expects NAME=RUN_DIR, got {item!r}")
        if not (Path(path) / "biencoder.json").is_file():
            raise FileNotFoundError(f"--run {item}: {path} is not a dpr-train run dir (no biencoder.json)")
        runs[name] = Path(path)
    return runs


def save_untrained(config_path: Path, model_name: str | None, out: Path, seed: int = 42) -> Path:
    """The untrained bi-encoder of a model config, saved as a run dir (as dpr-pipeline does)."""
    import torch
    from omegaconf import OmegaConf

    from dpr.models import BiEncoderConfig, build_biencoder, save_biencoder

    cfg = OmegaConf.to_container(OmegaConf.load(config_path), resolve=False)
    cfg.pop("defaults", None)  # a preset's defaults list: BiEncoderConfig's own defaults, which from_dict fills in
    if model_name:
        cfg["name"] = model_name
    if not (out / "biencoder.json").is_file():
        torch.manual_seed(seed)
        model, tokenizer = build_biencoder(BiEncoderConfig.from_dict(cfg))
        save_biencoder(model, tokenizer, out)
    return out


def evaluate_dataset(ds: DatasetPaths, models: Mapping[str, Path], out: Path, k: int, batch_size: int) -> dict:
    """BM25 and every model on ``ds``'s test split; returns ``{system: metric}`` (fractions)."""
    from dpr import bm25, encode, index as faiss_index
    from dpr.encode_config import EncodeConfig
    from dpr.retrieval import BM25Retriever, Retriever, runs as retrieve
    from dpr.eval.report import evaluate_qa, evaluate_qrels

    stages = StageRunner(out / "stages")
    qrels = ds.kind == "qrels"
    ext = ".trec" if qrels else ".json"
    questions = [ds.queries, ds.qrels("test")] if qrels else [ds.qa("test")]
    runs = {"bm25": out / "bm25" / f"test{ext}"}
    stages.run("bm25", lambda: retrieve.retrieve_split(
        BM25Retriever(bm25.get_or_build_index(ds.passages, out / "bm25_index"), None if qrels else ds.passages),
        ds, "test", runs["bm25"], k=k),
        outputs=[runs["bm25"]], inputs=[ds.passages, *questions], params={"k": k})
    for name, model in models.items():
        sdir = out / name
        emb, idx, res = sdir / "embeddings", sdir / "index.faiss", sdir / f"test{ext}"
        inputs = [model / "biencoder.json", ds.passages]
        stages.run(f"{name}_encode", lambda model=model, emb=emb: encode.encode_corpus(
            model, ds.passages, emb, EncodeConfig(batch_size=batch_size), progress=False), outputs=[emb], inputs=inputs)
        stages.run(f"{name}_index", lambda emb=emb, idx=idx: faiss_index.build_and_save(emb, idx),
                   outputs=[idx], inputs=[emb])
        stages.run(f"{name}_retrieve", lambda model=model, idx=idx, res=res: retrieve.retrieve_split(
            Retriever.dense(model, idx, None if qrels else ds.passages, batch_size=batch_size), ds, "test", res, k=k),
            outputs=[res], inputs=[*inputs, *questions],
            params={"k": k})
        runs[name] = res
    notes = {"dataset": ds.name, "transfer_matrix": True}
    if qrels:
        report = evaluate_qrels(runs, ds.qrels("test"), out / "eval", notes=notes)
        return {n: s[QRELS_METRIC] for n, s in report["systems"].items()}
    report = evaluate_qa(runs, out / "eval", ks=[1, 5, 20, 100], notes=notes)
    return {n: s["top_k"]["20"] for n, s in report["systems"].items()}


def render(matrix: dict) -> str:
    datasets = matrix["datasets"]
    header = ["system"] + [f"{d} ({matrix['metric'][d]})" for d in datasets]
    lines = ["# Transfer matrix", "",
             "Rows: retrievers; columns: test questions and corpus of each dataset. Figures in %: top-20 "
             "accuracy (QA data) or nDCG@10 (qrels data). `*`: evaluated on the dataset it was trained on.", "",
             "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for system, row in matrix["table"].items():
        cells = [f"{100 * row[d]:.1f}" + ("*" if system == f"trained on {d}" else "") if d in row else "n/a"
                 for d in datasets]
        lines.append("| " + " | ".join([system, *cells]) + " |")
    return "\n".join(lines) + "\n"


def transfer_matrix(data_dir: Path, datasets: Sequence[str], runs: Mapping[str, Path], out: Path,
                    untrained: Path | None, k: int = 100, batch_size: int = 64) -> dict:
    """Evaluate every model on every dataset; write ``transfer.json`` and ``transfer.md``; return the matrix."""
    models = {**({"untrained": untrained} if untrained else {}), **{f"trained on {n}": p for n, p in runs.items()}}
    dirs = {name: name.replace("trained on ", "trained_on_") for name in models}
    table: dict[str, dict[str, float]] = {"bm25": {}, **{m: {} for m in models}}
    metric = {}
    for name in datasets:
        ds = DatasetPaths.of(data_dir, name)
        if not ds.passages.is_file():
            raise FileNotFoundError(f"{ds.passages}: dataset {name} is not prepared (dpr-data data={name})")
        metric[name] = QRELS_METRIC if ds.kind == "qrels" else QA_METRIC
        log.info("evaluating on %s (%s)", name, metric[name])
        scores = evaluate_dataset(ds, {dirs[m]: p for m, p in models.items()}, out / name, k, batch_size)
        table["bm25"][name] = scores["bm25"]
        for m in models:
            table[m][name] = scores[dirs[m]]
    matrix = {"datasets": list(datasets), "metric": metric, "table": table,
              "runs": {n: str(p) for n, p in runs.items()}, "untrained": str(untrained) if untrained else None}
    write_json_atomic(out / "transfer.json", matrix)
    write_text_atomic(out / "transfer.md", render(matrix))
    return matrix


def main(argv: Sequence[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=REPO / "data" / "prepared")
    ap.add_argument("--datasets", nargs="+", default=["squad1_open", "sciq_open", "nfcorpus"])
    ap.add_argument("--run", action="append", default=[], metavar="NAME=RUN_DIR",
                    help="a retriever trained on dataset NAME (repeatable)")
    ap.add_argument("--untrained-config", type=Path, default=REPO / "conf" / "model" / "minilm.yaml",
                    help="model config of the untrained baseline")
    ap.add_argument("--untrained-model", default=None, help="override the config's model name (a path, say)")
    ap.add_argument("--no-untrained", action="store_true")
    ap.add_argument("--k", type=whole(1), default=100)
    ap.add_argument("--batch-size", type=whole(1), default=64)
    ap.add_argument("--out", type=owned_dir(MARKER, "transfer.json", "untrained_model"),
                    default=REPO / "runs" / "transfer", help="new, empty, or an earlier matrix's directory")
    args = ap.parse_args(argv)
    claim_dir(args.out, MARKER, "transfer_matrix.py")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    runs = parse_runs(args.run)
    untrained = None if args.no_untrained else save_untrained(args.untrained_config, args.untrained_model,
                                                              args.out / "untrained_model")
    matrix = transfer_matrix(args.data_dir, args.datasets, runs, args.out, untrained, k=args.k,
                             batch_size=args.batch_size)
    print(render(matrix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
