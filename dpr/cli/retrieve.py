"""`dpr-retrieve model=<run dir> index=<file> passages=<tsv> qa=<file> output=<file>` (dense), or
`dpr-retrieve mode=hybrid bm25=<file> dense=<file> output=<file>` (fusion)."""

from __future__ import annotations

import json
import sys

import hydra
from omegaconf import DictConfig

from dpr.cli.argv import hydra_argv
from dpr.cli.common import CONF_DIR, check_model_path, quiet_interrupt, report_errors
from dpr.config import fields_from
from dpr.retrieval.config import RetrieveConfig
from dpr.retrieval.config import register_schema as register_retrieve_schema
from dpr.retrieval.fusion import register_schema as register_hybrid_schema

register_retrieve_schema()  # retrieve_cfg/default and hybrid_cfg/default: conf/retrieve.yaml selects
register_hybrid_schema()  # RetrieveConfig's and HybridConfig's defaults


def _require(cfg: DictConfig, *keys: str) -> None:
    names = {"model_path": "model", "index_path": "index"}
    missing = [names.get(k, k) for k in keys if cfg.get(k) in (None, "")]
    if missing:
        raise ValueError(f"mode={cfg.mode} needs {', '.join(m + '=' for m in missing)}")


def _require_questions(cfg: DictConfig) -> None:
    """An empty question set would write an empty results file that later looks like a finished run."""
    if cfg.qa:
        from dpr.data.questions import read_questions

        if not read_questions(cfg.qa):
            raise ValueError(f"{cfg.qa}: no questions")
    elif cfg.queries:
        from dpr.data.questions import read_split_queries

        if cfg.qrels and cfg.passages:
            from dpr.data.beir import check_qrels_corpus

            check_qrels_corpus(cfg.qrels, cfg.passages)

        if not read_split_queries(cfg.queries, cfg.qrels or None):
            raise ValueError(f"{cfg.queries}: no queries" + (f" judged in {cfg.qrels}" if cfg.qrels else ""))


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="retrieve")
@report_errors("dpr-retrieve", file_outputs=("output",), file_kinds=("dpr_results", "trec_run"), schema="retrieve")
def _run(cfg: DictConfig) -> None:
    if cfg.mode == "hybrid":
        from dpr.retrieval.fusion import HybridConfig
        from dpr.retrieval.runs import hybrid_retrieve

        _require(cfg, "bm25", "dense")
        info = hybrid_retrieve(
            cfg.bm25, cfg.dense, cfg.output, bm25_dev=cfg.bm25_dev, dense_dev=cfg.dense_dev, qrels_dev=cfg.qrels_dev,
            config=fields_from(RetrieveConfig, cfg), hybrid=fields_from(HybridConfig, cfg),
        )
        info.pop("table", None)
        print(f"dpr-retrieve: hybrid → {cfg.output} {json.dumps(info)}")
        return
    if cfg.mode != "dense":
        raise ValueError(f"mode must be 'dense' or 'hybrid', got {cfg.mode!r}")
    from dpr.index.fingerprint import check_index_matches
    from dpr.retrieval.runs import dense_retrieve

    _require(cfg, "model_path", "index_path")
    check_model_path(cfg.model_path)
    # before any question is read or encoded: an index from another model or passages file is refused
    check_index_matches(cfg.index_path, cfg.model_path, cfg.passages or None)
    _require_questions(cfg)
    out = dense_retrieve(
        cfg.model_path, cfg.index_path, cfg.passages, cfg.qa, cfg.output, fields_from(RetrieveConfig, cfg),
        queries_path=cfg.queries, qrels_path=cfg.qrels,
    )
    print(f"dpr-retrieve: {len(out)} questions → {cfg.output}")


@quiet_interrupt("dpr-retrieve")
def main() -> None:
    sys.argv = hydra_argv(sys.argv, renames={"model": "model_path", "index": "index_path"})  # any order
    _run()


if __name__ == "__main__":
    main()
