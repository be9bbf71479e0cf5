"""Retrieval to files for any `dpr.retrieval.Retriever` (question files in, DPR results JSON or TREC runs
out): one split of a prepared dataset (`retrieve_split`), dense retrieval with a FAISS index, and hybrid
fusion of result files.

Dense works with any model and corpus on its own: a run dir or HF name, a FAISS index from `dpr-index`
(ids in ``<index>.ids``) and the passages TSV the index was encoded from. BM25, dense and hybrid go
through the same functions, so all write identical records.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dpr.checks import MAX_K, check_int
from dpr.config import check_known_keys, with_overrides
from dpr.data.questions import read_questions, read_split_queries, split_questions
from dpr.retrieval import records
from dpr.retrieval.config import RetrieveConfig
from dpr.retrieval.fusion import HybridConfig, Run, fuse_linear, fuse_rrf, tune_linear_weight
from dpr.retrieval.retriever import Retriever

log = logging.getLogger(__name__)

__all__ = ["dense_retrieve", "encode_questions", "retrieve_split", "retrieve_to_file", "hybrid_retrieve"]


def encode_questions(model_path: str | Path, questions: Sequence[str], batch_size: int = RetrieveConfig.batch_size,
                     device: str | None = RetrieveConfig.device, autocast: str | None = RetrieveConfig.autocast,
                     max_length: int | None = RetrieveConfig.max_length) -> tuple[np.ndarray, Any]:
    """Question vectors (float32 ``[N, D]``) and the model's config."""
    from dpr.distributed import resolve_device
    from dpr.models import EncodeOptions, encode_texts, load_biencoder

    dev = resolve_device(device)  # the one device rule (auto/null: cuda:LOCAL_RANK when CUDA is present)
    model, tokenizer = load_biencoder(str(model_path))
    model.to(dev)
    options = EncodeOptions(batch_size=batch_size, max_length=max_length, device=dev, autocast=autocast, progress=True)
    vecs = encode_texts(model, tokenizer, list(questions), "question", options)
    return vecs.numpy(), model.config


def retrieve_to_file(retriever: Retriever, output: str | Path | None = None, k: int = RetrieveConfig.k, *,
                     qa_path: str | Path | None = None, queries_path: str | Path | None = None,
                     qrels_path: str | Path | None = None, match: str = RetrieveConfig.match) -> list[dict] | Run:
    """Any retriever over a question file: ``qa_path`` (``.qa.tsv`` or retriever ``.json``) → DPR results
    JSON with ``has_answer``; BEIR ``queries_path`` (the queries judged in ``qrels_path`` when given) →
    a TREC run. Written to ``output`` when given; returned either way."""
    from dpr.data.results import write_results, write_trec_run

    if (qa_path is None) == (queries_path is None):
        raise ValueError("give exactly one of qa (question/answers file) or queries (BEIR queries.jsonl)")
    if qa_path is not None:
        if retriever.store is None:
            raise ValueError("QA retrieval needs passages= (the passages.tsv the index was built from)")
        results: list[dict] = []
        stream = records.iter_qa_records(retriever, read_questions(qa_path), k=k, match=match)
        if output is None:
            return list(stream)
        write_results(output, (results.append(r) or r for r in stream))
        log.info("wrote %s results for %d questions to %s", retriever.name, len(results), output)
        return results
    queries = read_split_queries(queries_path, qrels_path)
    run = records.trec_run(retriever, queries, k=k)
    if output is not None:
        write_trec_run(output, run, retriever.name)
        log.info("wrote a %s run for %d queries to %s", retriever.name, len(run), output)
    return run


def retrieve_split(retriever: Retriever, ds: Any, split: str, output: str | Path, k: int = RetrieveConfig.k,
                   match: str = RetrieveConfig.match) -> Path:
    """One split of a prepared dataset (`dpr.data.dataset.DatasetPaths`) through any retriever (BM25,
    dense, hybrid): ``<split>.qa.tsv`` (else ``<split>.json``) → results JSON, or the queries judged in
    ``qrels/<split>.tsv`` → TREC run, at ``output``."""
    retrieve_to_file(retriever, output, k, match=match, **split_questions(ds, split))
    return Path(output)


def dense_retrieve(
    model_path: str | Path,
    index_path: str | Path,
    passages_path: str | Path | None = None,
    qa_path: str | Path | None = None,
    output: str | Path | None = None,
    config: RetrieveConfig | None = None,
    *,
    queries_path: str | Path | None = None,
    qrels_path: str | Path | None = None,
    tag: str = "dense",
    **options: Any,
) -> list[dict] | Run:
    """Retrieve the top ``k`` passages per question with `Retriever.dense` and the settings ``config`` (a
    `RetrieveConfig`, its defaults when None: dpr-retrieve's keys; its fields may also be given as keywords, e.g.
    ``k``, ``match``, ``batch_size``, ``device``, ``autocast``, ``index_device``, ``nprobe``, ``max_length``, which
    override it).

    QA data (``qa_path``: ``.qa.tsv`` or retriever ``.json``): DPR results JSON with ``has_answer``
    per passage (``match``: "string" or "regex", `dpr.eval.has_answer`); needs ``passages_path``.
    BEIR data (``queries_path``, optionally ``qrels_path`` to keep that split's queries): a TREC run
    ``{qid: {docid: score}}``. Written to ``output`` when given; returned either way.
    """
    cfg = with_overrides(config or RetrieveConfig(), options, "dense_retrieve()")
    if (qa_path is None) == (queries_path is None):
        raise ValueError("give exactly one of qa (question/answers file) or queries (BEIR queries.jsonl)")
    if qa_path is not None and passages_path is None:
        raise ValueError("QA retrieval needs passages= (the passages.tsv the index was built from)")
    retriever = Retriever.dense(model_path, index_path, passages_path if qa_path is not None else None, config=cfg)
    retriever.name = tag
    log.info("retrieving top %d from %s (%d passages)", cfg.k, index_path, len(retriever.ids))
    return retrieve_to_file(retriever, output, cfg.k, qa_path=qa_path, queries_path=queries_path,
                            qrels_path=qrels_path, match=cfg.match)


def hybrid_retrieve(
    bm25: str | Path,
    dense: str | Path,
    output: str | Path,
    bm25_dev: str | Path | None = None,
    dense_dev: str | Path | None = None,
    qrels_dev: str | Path | None = None,
    *,
    config: RetrieveConfig | None = None,
    hybrid: HybridConfig | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Fuse a BM25 and a dense result file (results JSON or TREC runs) into ``output``, ``k`` per question.

    ``config`` (`RetrieveConfig`): ``fusion="linear"``: with ``weight`` given it is used as is; otherwise it is
    tuned on the dev result files (``bm25_dev``, ``dense_dev``; ``qrels_dev`` for TREC runs). ``fusion="rrf"``:
    reciprocal rank fusion. ``hybrid``: how the weight is tuned and the runs fused (`HybridConfig`). The fields of
    either may also be given as keywords (``fusion=``, ``weight=``, ``k=``, ``grid=``, ``metric_k=``,
    ``k_rrf=``...), which override them. Returns what was done (``weight`` and the tuning ``table`` for linear).
    """
    hybrid_names = [f.name for f in dataclasses.fields(HybridConfig)]
    check_known_keys(fields, [f.name for f in dataclasses.fields(RetrieveConfig)] + hybrid_names, "hybrid_retrieve()")
    how = with_overrides(hybrid or HybridConfig(), {n: v for n, v in fields.items() if n in hybrid_names},
                         "hybrid_retrieve()")
    cfg = with_overrides(config or RetrieveConfig(), {n: v for n, v in fields.items() if n not in hybrid_names},
                         "hybrid_retrieve()")
    fusion, weight, k = cfg.fusion, cfg.weight, cfg.k
    _check_fusion(fusion, weight, k, how)
    if fusion == "rrf":
        fuse_rrf(bm25, dense, output, k=k, k_rrf=how.k_rrf)
        return {"fusion": "rrf", "k_rrf": how.k_rrf, "output": str(output)}
    if fusion != "linear":
        raise ValueError(f"fusion must be 'linear' or 'rrf', got {fusion!r}")
    table = None
    if weight is None:
        if bm25_dev is None or dense_dev is None:
            raise ValueError("linear fusion needs weight=<w>, or bm25_dev= and dense_dev= result files to tune it on")
        weight, table = tune_linear_weight(bm25_dev, dense_dev, grid=list(how.grid), metric_k=how.metric_k,
                                           qrels=qrels_dev, normalize=how.normalize, metric=how.metric)
    fuse_linear(bm25, dense, float(weight), output, k=k, normalize=how.normalize)
    return {"fusion": "linear", "weight": float(weight), "normalize": how.normalize, "metric": how.metric,
            "metric_k": how.metric_k, "table": table, "output": str(output)}


def _check_fusion(fusion: str, weight: float | None, k: int, how: HybridConfig) -> None:
    """Every number the fusion uses, before any file is read or the weight tuned (one-line ValueErrors)."""
    from dpr.retrieval.fusion import FUSIONS, check_grid, check_k_rrf, check_normalize, check_weight

    if fusion not in FUSIONS:
        raise ValueError(f"fusion must be one of {FUSIONS}, got {fusion!r}")
    check_int("k", k, 1, MAX_K)
    if fusion == "rrf":
        check_k_rrf(how.k_rrf)
    elif weight is not None:
        check_weight(weight)
    else:
        check_grid(list(how.grid))
        check_int("metric_k", how.metric_k, 1, MAX_K)
    check_normalize(how.normalize)
