"""The reader inside ``dpr-pipeline … reader=true``: train once, read every system's top k, report.

Two stages of the pipeline's :class:`~dpr.stages.StageRunner` (skipped when up to date):
``reader_train`` (→ ``<out>/reader/``) and ``reader_eval`` (→ ``<out>/reader/eval.json``: figures,
predictions, the count of EM above the top-k bound, gold-passage source, wall time).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Mapping

from dpr.atomic import write_json_atomic
from dpr.data.dataset import DatasetPaths
from dpr.stages import StageRunner
from dpr.trainkit.config_dict import plain

log = logging.getLogger(__name__)

# with teacher=true the reranked lists too (dpr/rerank/pipeline.py): the reader reads their top k in the new order
SYSTEMS = ("bm25", "dense", "hybrid", "bm25+rerank", "dense+rerank", "hybrid+rerank")


def reader_report(cfg_reader: Any, ds: DatasetPaths, runs: Mapping[str, Path], out_dir: str | Path,
                  stages: StageRunner, split: str = "test") -> dict:
    """``{"gold": {"em", "f1"}, "systems": {system: {"<k>": {"em", "f1"}}}}`` (fractions), for the
    systems bm25/dense/hybrid found in ``runs`` (DPR results JSON of ``split``)."""
    from dpr.reader.evaluate import answer_rule, gold_scores, limit, read_kwargs
    from dpr.reader.gold import gold_records
    from dpr.reader.model import load_reader
    from dpr.reader.open_domain import read_topk
    from dpr.reader.train import train_reader

    if ds.kind != "qa":
        raise ValueError(f"{ds.root}: the reader needs QA data (answer strings); this dataset is {ds.kind!r}")
    rcfg = plain(cfg_reader)
    rdir = Path(out_dir) / "reader"
    model_dir, eval_file = rdir / "reader", rdir / "eval.json"
    systems = {name: Path(runs[name]) for name in SYSTEMS if name in runs}
    # the stage runs only when its inputs or settings changed: the run in rdir is the pipeline's own (overwrite)
    stages.run("reader_train", lambda: train_reader(rcfg, ds.train, rdir, overwrite=True),
               outputs=[model_dir / "reader.json"], inputs=[ds.train],
               params={k: v for k, v in rcfg.items() if k != "eval"})

    def evaluate() -> None:
        from dpr.data.results import read_results

        t0 = time.perf_counter()
        ecfg = rcfg["eval"]
        model, tokenizer, settings = load_reader(model_dir)
        cache: dict = {}  # systems share most top-k passages: read each (question, passage) once
        records, how = gold_records(ds, split, systems.get("bm25"))
        gold, gold_preds = gold_scores(model, tokenizer, settings, records, ecfg, cache)
        out: dict = {"gold": gold, "systems": {}, "em_above_bound": {}, "gold_passages": how,
                     "num_gold_questions": len(records), "predictions": {"gold": gold_preds}}
        for name, path in systems.items():
            recs = limit(read_results(path), int(ecfg.get("max_questions", 0)))
            res = read_topk(model, tokenizer, settings, recs, ks=list(ecfg["ks"]),
                            rule=answer_rule(ecfg), cache=cache, **read_kwargs(ecfg))
            out["systems"][name] = res["k"]
            out["em_above_bound"][name] = res["em_above_bound"]
            out["predictions"][name] = res["predictions"]
            out["num_questions"] = len(recs)
        out["seconds"] = round(time.perf_counter() - t0, 1)
        write_json_atomic(eval_file, out)

    stages.run("reader_eval", evaluate, outputs=[eval_file],
               inputs=[model_dir / "reader.json", *systems.values(), ds.qa(split)], params=rcfg["eval"])
    full = json.loads(eval_file.read_text(encoding="utf-8"))
    return {"gold": full["gold"], "systems": full["systems"]}


def reader_details(out_dir: str | Path, stages: StageRunner | None = None) -> dict:
    """What the report shows beside the figures: EM-above-bound counts, gold source, wall times."""
    full = json.loads((Path(out_dir) / "reader" / "eval.json").read_text(encoding="utf-8"))
    details = {k: full[k] for k in ("em_above_bound", "gold_passages", "num_gold_questions") if k in full}
    details["num_questions"] = full.get("num_questions")
    seconds = {"eval": full.get("seconds")}
    if stages is not None:
        seconds.update({k.replace("reader_", ""): round(v, 1) for k, v in stages.timings.items() if k.startswith("reader_")})
    details["seconds"] = seconds
    return details


def attach_reader(report: dict, reader: dict, out_dir: str | Path, eval_dir: str | Path,
                  stages: StageRunner | None = None) -> dict:
    """Put ``reader`` under ``report["reader"]`` and rewrite the report files with the reader columns."""
    from dpr.eval.report import add_reader

    return add_reader(report, reader, reader_details(out_dir, stages), eval_dir)
