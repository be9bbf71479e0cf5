"""A first stage's ranked lists reranked by the cross-encoder, as the pipeline's rerank stages use them.

- :func:`first_stage_records`: DPR results records of a results JSON, or of a TREC run (qrels data: the
  query texts from queries.jsonl, the passage texts from passages.tsv, ``query_id`` kept), ranked;
  :func:`run_texts` loads those two files of a dataset (the one loader of ``dpr-rerank score`` and the pipeline).
- :func:`pair_scores`: the cross-encoder's logit of every distinct (question, passage id) pair in the top
  ``depth`` of several systems' lists, scored once (first stages share most of their top passages).
- :func:`reranked`: each list's top ``k`` ordered by those logits (best first; equal logits keep the first
  stage's order: `dpr.rerank.score.rerank_results`' rule and fields), followed by the rest of the first
  stage's list as it was, so every depth of the report compares the same passages (Recall@k for k >= K is
  the first stage's; reranking only moves passages inside the top K).
- :func:`write_reranked`: the DPR results JSON and, for qrels data, the TREC run the report reads (its
  scores strictly decrease with the new rank: trec_eval orders by score).
- :func:`lowers_dev` and :func:`keep_first_stage`: a first stage that reranking made worse on dev keeps its
  own list as its ``+rerank`` row (the files copied, byte for byte).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from dpr.atomic import write_json
from dpr.output_sets import atomic_paths, file_manifest
from dpr.rerank.model import document_text
from dpr.rerank.score import score_pairs
from dpr.retrieval.fusion import normalize_scores

PairScores = dict[tuple[str, str], float]


def run_texts(ds: Any, run: str | Path) -> tuple[dict[str, str], Any]:
    """The query texts (id -> text) and the passages (a `dpr.data.passages.PassageLookup`) of the prepared
    dataset ``ds`` (a `dpr.data.dataset.DatasetPaths`), which the ids of the TREC run ``run`` point at."""
    from dpr.data.beir import read_queries
    from dpr.data.passages import PassageLookup

    for path in (ds.queries, ds.passages):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; the TREC run {run} names query and passage ids, read "
                                    f"from data={ds.name}'s queries.jsonl and passages.tsv (a BEIR-style dataset, "
                                    "prepared by dpr-data)")
    return read_queries(ds.queries), PassageLookup.from_file(ds.passages)


def first_stage_records(path: str | Path, queries: Mapping[str, str] | None = None,
                        passages: Any = None) -> list[dict]:
    """The records of a results JSON, or of a TREC run (``queries``: id -> text, ``passages``: a
    `dpr.data.passages.PassageLookup`), each list in rank order."""
    from dpr.data.results import read_results, read_trec_run

    path = Path(path)
    if path.suffix != ".trec":
        return read_results(path)
    if queries is None or passages is None:
        raise ValueError(f"{path}: a TREC run needs the query texts and the passages to be reranked")
    records = []
    for qid, docs in read_trec_run(path).items():
        if qid not in queries:
            raise ValueError(f"{path}: query {qid!r} is not in the queries file")
        ranked = sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))  # write_trec_run's order
        ctxs = []
        for pid, score in ranked:
            if pid not in passages:
                raise ValueError(f"{path}: passage {pid!r} of query {qid!r} is not in the passages file")
            row = passages[pid]
            ctxs.append({"id": pid, "title": row.get("title") or "", "text": row["text"], "score": float(score)})
        records.append({"question": queries[qid], "answers": [], "query_id": qid, "ctxs": ctxs})
    return records


def pair_scores(model: torch.nn.Module, tokenizer: Any, settings: Mapping[str, Any],
                lists: Sequence[Sequence[Mapping[str, Any]]], depth: int, batch_size: int = 32,
                precision: str = "auto", known: PairScores | None = None) -> PairScores:
    """``{(question, passage id): logit}`` for every pair in the top ``depth`` of each records list
    (pairs already in ``known`` are not scored again)."""
    scores: PairScores = dict(known or {})
    todo: dict[tuple[str, str], str] = {}
    for records in lists:
        for rec in records:
            for ctx in rec["ctxs"][:depth]:
                key = (rec["question"], str(ctx["id"]))
                if key not in scores and key not in todo:
                    todo[key] = document_text(ctx["title"], ctx["text"], tokenizer, bool(settings["title"]))
    if todo:
        keys = list(todo)
        logits = score_pairs(model, tokenizer, [q for q, _ in keys], [todo[k] for k in keys], batch_size=batch_size,
                             autocast=precision, max_length=int(settings["max_length"])).tolist()
        scores.update(zip(keys, logits))
    return scores


def reranked(records: Sequence[Mapping[str, Any]], scores: PairScores, k: int, weight: float = 0.0) -> list[dict]:
    """Each record's top ``k`` by the cross-encoder's logit, then its remaining ctxs in the first stage's order.

    ``weight`` > 0 interpolates: the top ``k`` are ordered by minmax(logit) + weight * minmax(first-stage
    score), each min-max taken over the question's top ``k``. A first stage that already ranks well (the
    hybrid on squad1_open dev: top-1 87.8 before, 85.8 reranked alone) keeps what the cross-encoder does
    not know; weight 0 is the cross-encoder alone. The logit itself is kept as ``rerank_logit``."""
    out = []
    for rec in records:
        ctxs = list(rec["ctxs"])
        head = [scores[(rec["question"], str(c["id"]))] for c in ctxs[:k]]
        final = head
        if weight and head:
            first = normalize_scores([float(c["score"]) for c in ctxs[:k]])
            final = (normalize_scores(head) + weight * first).tolist()
        order = sorted(range(len(head)), key=lambda j: (-final[j], j))
        top = [{**ctxs[j], "score": final[j], "rerank_logit": head[j], "first_stage_score": ctxs[j]["score"],
                "first_stage_rank": j} for j in order]
        tail = [{**c, "first_stage_score": c["score"], "first_stage_rank": j} for j, c in enumerate(ctxs[k:], k)]
        out.append({**rec, "ctxs": top + tail})
    return out


def timed_rerank(model: torch.nn.Module, tokenizer: Any, settings: Mapping[str, Any],
                 records: Sequence[Mapping[str, Any]], k: int, batch_size: int = 32,
                 precision: str = "auto", known: PairScores | None = None,
                 weight: float = 0.0) -> tuple[list[dict], dict]:
    """:func:`reranked` of one system, and what its scoring cost. Pairs in ``known`` (another system's
    reranked lists: first stages share most of their top passages) are not scored again; the stats keep
    the system's own cost apart from that saving: ``seconds`` is what this call took, ``seconds_per_pair``
    what each pair it scored took, and ``seconds_per_question`` what reranking this system's top ``k``
    alone costs at that rate (every pair of its lists, reused or not)."""
    t0 = time.perf_counter()
    own = {(rec["question"], str(c["id"])) for rec in records for c in rec["ctxs"][:k]}
    reuse = {key: v for key, v in (known or {}).items() if key in own}
    scores = pair_scores(model, tokenizer, settings, [records], k, batch_size=batch_size, precision=precision,
                         known=reuse)
    out = reranked(records, scores, k, weight)
    seconds = time.perf_counter() - t0
    scored = len(own) - len(reuse)
    n = max(1, len(records))
    per_pair = seconds / scored if scored else None
    return out, {"k": k, "questions": len(records), "pairs": len(own), "scored": scored, "reused": len(reuse),
                 "seconds": round(seconds, 3), "seconds_per_pair": None if per_pair is None else round(per_pair, 6),
                 "seconds_per_question": None if per_pair is None else round(per_pair * len(own) / n, 5)}


def known_pairs(records: Sequence[Mapping[str, Any]], k: int) -> PairScores:
    """The cross-encoder logits held by lists :func:`reranked` wrote with depth ``k`` (their first ``k`` ctxs)."""
    return {(rec["question"], str(c["id"])): float(c.get("rerank_logit", c["score"]))
            for rec in records for c in rec["ctxs"][:k]}


def write_reranked(records: Sequence[Mapping[str, Any]], json_path: str | Path, trec_path: str | Path | None = None,
                   tag: str = "rerank") -> None:
    """The DPR results JSON; with ``trec_path`` also a TREC run whose scores follow the list order."""
    from dpr.data.results import write_results, write_trec_run

    if trec_path is not None:
        run = {}
        for rec in records:
            n = len(rec["ctxs"])
            run[str(rec["query_id"])] = {str(c["id"]): float(n - j) for j, c in enumerate(rec["ctxs"])}
        write_trec_run(trec_path, run, tag=tag)
    write_results(json_path, records)


def choose_k(per_k: Mapping[int, Mapping[str, float]], metric: str, tolerance: float = 0.0) -> int:
    """The smallest depth whose dev ``metric`` is within ``tolerance`` of the best depth's (reranking
    costs linearly in K: a deeper list must earn its price); tolerance 0: the best, ties to the smaller."""
    best = max(v[metric] for v in per_k.values())
    return min(k for k, v in per_k.items() if v[metric] >= best - tolerance)


def choose_weight(per_weight: Mapping[float, Mapping[str, float]], metric: str) -> float:
    """The interpolation weight with the best dev ``metric``; ties to the smaller weight (more cross-encoder)."""
    best = max(v[metric] for v in per_weight.values())
    return min(w for w, v in per_weight.items() if v[metric] >= best)


def lowers_dev(system: Mapping[str, Any], metric: str) -> bool:
    """Whether reranking at the chosen depth and weight scored below the first stage itself on dev
    (``system``: one entry of the rerank stage's dev.json ``systems``). Strictly below: a tie reranks."""
    return float(system["dev"][str(system["k"])][metric]) < float(system["first_stage"][metric])


def keep_first_stage(first_stage: str | Path, json_path: str | Path, trec_path: str | Path | None,
                     stats_path: str | Path, records: Sequence[Mapping[str, Any]]) -> dict:
    """A ``+rerank`` row that is its first stage: the first stage's results file copied to ``json_path``
    (a TREC run, on qrels data, to ``trec_path``, with ``records``, its records, written as the JSON), so
    the report scores the same lists, ties and all; the stats say so and price it at zero. The lists and the
    stats are one set, as `dpr.rerank.rerank_file.write_reranked_set` writes it: moved in with the stats last,
    which name the lists by size and hash (``files``), so a kill between the moves is refused on read."""
    from dpr.data.results import write_results

    src = Path(first_stage)
    if src.suffix == ".trec" and trec_path is None:
        raise ValueError(f"{src}: keeping a TREC run needs a TREC output path")
    lists = [Path(json_path), *([Path(trec_path)] if src.suffix == ".trec" else [])]
    stats = {"kept_first_stage": True, "questions": len(records), "pairs": 0, "scored": 0, "reused": 0, "seconds": 0.0,
             "seconds_per_pair": None, "seconds_per_question": 0.0, "first_stage": str(src)}
    with atomic_paths([*lists, stats_path]) as tmps:
        if src.suffix == ".trec":
            shutil.copyfile(src, tmps[1])
            write_results(tmps[0], records)
        else:
            shutil.copyfile(src, tmps[0])
        write_json(tmps[-1], {**stats, "files": file_manifest({p.name: t for p, t in zip(lists, tmps)})})
    return stats
