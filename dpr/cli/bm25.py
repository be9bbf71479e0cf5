"""``dpr-bm25``: BM25 retrieval to a results file, and hard-negative mining (Hydra entry point).

Keys at the root: the index's settings (`BM25Config`), the mining depths (`BM25MiningConfig`), how the index is
built (``shard_passages``, `BM25BuildConfig`) and searched (``n_threads``, `BM25SearchConfig`).
"""

from __future__ import annotations

import sys
import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from dpr.cli.argv import hydra_argv
from dpr.bm25.config import register_schema
from dpr.cli.common import CONF_DIR, quiet_interrupt, report_errors
from dpr.negatives.bm25_config import register_schema as register_mining_schema

register_schema()  # bm25_cfg/default and bm25_mine_cfg/default: conf/bm25.yaml selects BM25Config's and
register_mining_schema()  # BM25MiningConfig's defaults

log = logging.getLogger(__name__)


def _index_params(cfg: DictConfig) -> dict:
    return {"k1": cfg.k1, "b": cfg.b, "stopwords": cfg.stopwords, "stemmer": cfg.stemmer}


def _build_params(cfg: DictConfig) -> dict:
    """The index's settings and how a missing index is built (in shards of ``shard_passages`` passages)."""
    return {**_index_params(cfg), "shard_passages": cfg.shard_passages}


def _require_questions(qa_path: str | Path) -> None:
    """An empty question set would write an empty results file that later passes for a finished run."""
    from dpr.data.qa import read_qa_tsv

    if not read_qa_tsv(qa_path):
        raise ValueError(f"{qa_path}: no questions")


def run_dataset(cfg: DictConfig) -> None:
    """``data=<name>``: retrieve for ``split`` into ``output`` and/or mine negatives into train/dev."""
    from dpr import bm25
    from dpr.data.dataset import DatasetPaths
    from dpr.data.questions import read_questions, read_split_queries
    from dpr.negatives.bm25 import mine_dataset
    from dpr.retrieval import BM25Retriever, records

    ds = DatasetPaths.of(cfg.data_dir, cfg.data.name)
    if not ds.passages.is_file():
        raise FileNotFoundError(f"no prepared dataset at {ds.root} (passages.tsv missing): run dpr-data first")
    if not cfg.output and not cfg.mine:
        raise ValueError("nothing to do: give output=<file> to retrieve, or mine=true")
    if cfg.output and not ds.has_qrels:
        _require_questions(ds.qa(cfg.split))  # before any index is built
    index_dir = Path(cfg.index_dir) if cfg.index_dir else ds.root / "bm25_index"
    index = bm25.get_or_build_index(ds.passages, index_dir, **_build_params(cfg))
    if cfg.output:
        output = Path(cfg.output)
        if ds.has_qrels:
            from dpr.data.beir import check_qrels_corpus

            check_qrels_corpus(ds.qrels(cfg.split), ds.passages)
            queries = read_split_queries(ds.queries, ds.qrels(cfg.split))
            records.write_trec_run(BM25Retriever(index, n_threads=cfg.n_threads), queries, output, k=cfg.k)
        else:
            records.write_qa_records(BM25Retriever(index, ds.passages, n_threads=cfg.n_threads),
                                     read_questions(ds.qa(cfg.split)), output, k=cfg.k)
    if cfg.mine:
        stats = mine_dataset(index, ds, num_negatives=cfg.num_negatives, depth=cfg.depth,
                             n_threads=cfg.n_threads, force=cfg.force)
        for split, st in stats.items():
            log.info("%s: %s", split, st)


def run_standalone(cfg: DictConfig) -> None:
    """``passages=<tsv>`` with ``qa=<tsv>`` or ``queries=<jsonl>`` [``qrels=<tsv>``], ``output=<file>``."""
    from dpr import bm25
    from dpr.data.questions import read_questions, read_split_queries
    from dpr.retrieval import BM25Retriever, records

    if not cfg.output:
        raise ValueError("standalone use needs output=<file>")
    if bool(cfg.qa) == bool(cfg.queries):
        raise ValueError("standalone use needs exactly one of qa=<QA TSV> or queries=<BEIR queries.jsonl>")
    if cfg.mine:
        raise ValueError("mine=true needs a prepared dataset (data=<name>)")
    passages = Path(cfg.passages)
    if cfg.index_dir:
        index = bm25.get_or_build_index(passages, cfg.index_dir, **_build_params(cfg))
    else:
        index = bm25.build_index(passages, **_build_params(cfg))
    if cfg.qa:
        _require_questions(cfg.qa)
        records.write_qa_records(BM25Retriever(index, passages, n_threads=cfg.n_threads), read_questions(cfg.qa),
                                 cfg.output, k=cfg.k)
        return
    if cfg.qrels:
        from dpr.data.beir import check_qrels_corpus

        check_qrels_corpus(cfg.qrels, passages)
    queries = read_split_queries(cfg.queries, cfg.qrels or None)
    records.write_trec_run(BM25Retriever(index, n_threads=cfg.n_threads), queries, cfg.output, k=cfg.k)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="bm25")
@report_errors("dpr-bm25", file_outputs=("output",), file_kinds=("dpr_results", "trec_run"), schema="bm25")
def _run(cfg: DictConfig) -> None:
    if cfg.get("data") is not None and cfg.passages:
        raise ValueError("give either data=<name> or passages=<tsv>, not both")
    if cfg.get("data") is not None:
        run_dataset(cfg)
    elif cfg.passages:
        run_standalone(cfg)
    else:
        raise ValueError("say what to search: data=<name> (a prepared dataset) or passages=<tsv>")


@quiet_interrupt("dpr-bm25")
def main() -> None:
    sys.argv = hydra_argv(sys.argv)  # overrides and Hydra's flags in any order
    _run()


if __name__ == "__main__":
    main()
