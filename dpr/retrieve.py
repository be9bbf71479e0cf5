"""Dense retrieval (question tower → FAISS top-k → DPR results JSON or TREC run) and hybrid fusion glue.

Works with any model and corpus on its own: a run dir or HF name, a FAISS index from `dpr-index`
(ids in ``<index>.ids``) and the passages TSV the index was encoded from.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dpr.errors import DataError
from dpr.fusion import DEFAULT_GRID, fuse_linear, fuse_rrf, tune_linear_weight

log = logging.getLogger(__name__)

__all__ = ["dense_retrieve", "retrieve_split", "hybrid_retrieve", "read_questions", "fetch_passages",
           "fuse_linear", "fuse_rrf", "tune_linear_weight"]


def read_questions(path: str | Path) -> list[tuple[str, list[str]]]:
    """(question, answers) pairs from a ``.qa.tsv`` file or a DPR retriever ``.json`` (e.g. dev.json)."""
    path = Path(path)
    if path.suffix == ".json":
        from dpr.data.retriever_json import read_retriever_json

        return [(ex["question"], list(ex["answers"])) for ex in read_retriever_json(path)]
    from dpr.data.qa import read_qa_tsv

    return [(p.question, list(p.answers)) for p in read_qa_tsv(path)]


def read_split_queries(queries_path: str | Path, qrels_path: str | Path | None = None) -> dict[str, str]:
    """BEIR queries, restricted to those judged in ``qrels_path`` when given (queries.jsonl holds every split)."""
    from dpr.data.beir import read_qrels, read_queries

    queries = read_queries(queries_path)
    if qrels_path is None:
        return queries
    judged = read_qrels(qrels_path)
    missing = [q for q in judged if q not in queries]
    if missing:
        raise DataError(qrels_path, f"{len(missing)} judged queries absent from {queries_path}, e.g. {missing[0]!r}",
                        field="query-id")
    return {qid: text for qid, text in queries.items() if qid in judged}


def fetch_passages(passages_path: str | Path, ids: Sequence[str], cache_dir: str | Path | None = None) -> dict[str, dict]:
    """``{id: {"title", "text"}}`` for the given ids, found with one vectorised scan of the Arrow id column
    (no id → row dict over the whole corpus)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from dpr.data.passages import load_passages

    wanted = sorted(set(ids))
    if not wanted:
        return {}
    ds = load_passages(passages_path, cache_dir=cache_dir)
    mask = pc.is_in(ds.data.column("id"), value_set=pa.array(wanted, type=pa.string()))
    rows = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
    found = {r["id"]: {"title": r["title"], "text": r["text"]} for r in ds.select(rows)}
    if len(found) != len(wanted):
        absent = [pid for pid in wanted if pid not in found]
        raise DataError(passages_path, f"{len(absent)} retrieved passage ids are not in this passages file, "
                        f"e.g. {absent[0]!r} (index built from another corpus?)", field="id")
    return found


def encode_questions(model_path: str | Path, questions: Sequence[str], batch_size: int = 64,
                     device: str | None = None, autocast: str | None = "auto",
                     max_length: int | None = None) -> tuple[np.ndarray, Any]:
    """Question vectors (float32 ``[N, D]``) and the model's config."""
    import torch

    from dpr.distributed import device as default_device
    from dpr.models import encode_texts, load_biencoder

    dev = torch.device(device) if device else default_device()
    model, tokenizer = load_biencoder(str(model_path))
    model.to(dev)
    vecs = encode_texts(model, tokenizer, list(questions), "question", batch_size=batch_size,
                        max_length=max_length, device=dev, autocast=autocast, progress=True)
    return vecs.numpy(), model.config


def _check_index_matches(index_path: Path, meta: dict, config: Any, dim: int, index_dim: int) -> None:
    if dim != index_dim:
        raise DataError(index_path, f"the model's vectors have {dim} dims but the index has {index_dim}: "
                        "index built with another model?", field="dim")
    cosine = config.similarity == "cosine"
    if "normalized" in meta and bool(meta["normalized"]) != cosine:
        log.warning("%s holds %s passage vectors but the model uses %s similarity: scores will not match "
                    "the model's", index_path, "normalised" if meta["normalized"] else "raw", config.similarity)


def dense_retrieve(
    model_path: str | Path,
    index_path: str | Path,
    passages_path: str | Path | None = None,
    qa_path: str | Path | None = None,
    output: str | Path | None = None,
    k: int = 100,
    *,
    queries_path: str | Path | None = None,
    qrels_path: str | Path | None = None,
    batch_size: int = 64,
    search_batch_size: int = 1024,
    device: str | None = None,
    autocast: str | None = "auto",
    index_device: str = "cpu",
    nprobe: int | None = None,
    ef_search: int | None = None,
    match: str = "string",
    max_length: int | None = None,
    tag: str = "dense",
    cache_dir: str | Path | None = None,
) -> list[dict] | dict[str, dict[str, float]]:
    """Retrieve the top ``k`` passages per question.

    QA data (``qa_path``: ``.qa.tsv`` or retriever ``.json``): DPR results JSON with ``has_answer``
    per passage (``match``: "string" or "regex", `dpr.eval.has_answer`); needs ``passages_path``.
    BEIR data (``queries_path``, optionally ``qrels_path`` to keep that split's queries): a TREC run
    ``{qid: {docid: score}}``. Written to ``output`` when given; returned either way.
    """
    from dpr.index import load_index, read_index_meta, search

    if (qa_path is None) == (queries_path is None):
        raise ValueError("give exactly one of qa (question/answers file) or queries (BEIR queries.jsonl)")
    if qa_path is not None and passages_path is None:
        raise ValueError("QA retrieval needs passages= (the passages.tsv the index was built from)")
    if qa_path is not None:
        pairs = read_questions(qa_path)
        texts = [q for q, _ in pairs]
    else:
        queries = read_split_queries(queries_path, qrels_path)
        texts = list(queries.values())
    index_path = Path(index_path)
    index, ids = load_index(index_path, device=index_device, nprobe=nprobe, ef_search=ef_search)
    meta = read_index_meta(index_path)
    log.info("retrieving top %d for %d questions from %s (%d passages)", k, len(texts), index_path, len(ids))
    qvecs, config = encode_questions(model_path, texts, batch_size, device, autocast, max_length)
    _check_index_matches(index_path, meta, config, qvecs.shape[1] if qvecs.ndim == 2 else 0, index.d)
    hits, scores = search(index, ids, qvecs, k, batch_size=search_batch_size)

    if qa_path is None:
        run = {qid: {pid: float(s) for pid, s in zip(row, srow)} for qid, row, srow in zip(queries, hits, scores)}
        if output is not None:
            from dpr.data.results import write_trec_run

            write_trec_run(output, run, tag)
            log.info("wrote a TREC run for %d queries to %s", len(run), output)
        return run

    from dpr.eval.has_answer import has_answer

    passages = fetch_passages(passages_path, [pid for row in hits for pid in row], cache_dir=cache_dir)
    results = []
    for (question, answers), row, srow in zip(pairs, hits, scores):
        ctxs = []
        for pid, score in zip(row, srow):
            p = passages[pid]
            ctxs.append({"id": pid, "title": p["title"], "text": p["text"], "score": float(score),
                         "has_answer": has_answer(answers, p["text"], mode=match)})
        results.append({"question": question, "answers": answers, "ctxs": ctxs})
    if output is not None:
        from dpr.data.results import write_results

        write_results(output, results)
        log.info("wrote results for %d questions to %s", len(results), output)
    return results


def retrieve_split(model_path: str | Path, index_path: str | Path, ds: Any, split: str, output: str | Path,
                   k: int = 100, batch_size: int = 64, **kwargs: Any) -> Path:
    """Dense retrieval for one split of a prepared dataset (`dpr.data.dataset.DatasetPaths`), as
    `dpr.bm25.retrieve_split` does for BM25: ``<split>.qa.tsv`` (else ``<split>.json``) → results JSON,
    or the queries judged in ``qrels/<split>.tsv`` → TREC run."""
    if ds.kind == "qrels":
        dense_retrieve(model_path, index_path, output=output, k=k, queries_path=ds.queries,
                       qrels_path=ds.qrels(split), batch_size=batch_size, **kwargs)
    else:
        qa = Path(ds.qa(split))
        if not qa.is_file() and (Path(ds.root) / f"{split}.json").is_file():
            qa = Path(ds.root) / f"{split}.json"  # a dataset with retriever JSON only for this split
        dense_retrieve(model_path, index_path, ds.passages, qa, output, k=k, batch_size=batch_size, **kwargs)
    return Path(output)


def hybrid_retrieve(
    bm25: str | Path,
    dense: str | Path,
    output: str | Path,
    fusion: str = "linear",
    weight: float | None = None,
    bm25_dev: str | Path | None = None,
    dense_dev: str | Path | None = None,
    qrels_dev: str | Path | None = None,
    grid: Sequence[float] = DEFAULT_GRID,
    metric_k: int = 20,
    normalize: str = "minmax",
    k: int = 100,
    k_rrf: float = 60,
) -> dict[str, Any]:
    """Fuse a BM25 and a dense result file (results JSON or TREC runs) into ``output``.

    ``fusion="linear"``: with ``weight`` given it is used as is; otherwise it is tuned on the dev
    result files (``bm25_dev``, ``dense_dev``; ``qrels_dev`` for TREC runs). ``fusion="rrf"``:
    reciprocal rank fusion. Returns what was done (``weight`` and the tuning ``table`` for linear).
    """
    if fusion == "rrf":
        fuse_rrf(bm25, dense, output, k=k, k_rrf=k_rrf)
        return {"fusion": "rrf", "k_rrf": k_rrf, "output": str(output)}
    if fusion != "linear":
        raise ValueError(f"fusion must be 'linear' or 'rrf', got {fusion!r}")
    table = None
    if weight is None:
        if bm25_dev is None or dense_dev is None:
            raise ValueError("linear fusion needs weight=<w>, or bm25_dev= and dense_dev= result files to tune it on")
        weight, table = tune_linear_weight(bm25_dev, dense_dev, grid=grid, metric_k=metric_k, qrels=qrels_dev,
                                           normalize=normalize)
    fuse_linear(bm25, dense, float(weight), output, k=k, normalize=normalize)
    return {"fusion": "linear", "weight": float(weight), "normalize": normalize, "metric_k": metric_k,
            "table": table, "output": str(output)}
