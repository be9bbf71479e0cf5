#!/usr/bin/env python
"""Cost curves to a million passages: BM25 and FAISS flat / HNSW / IVF-PQ, projected to 21M passages.

    nice -n 10 .venv/bin/python scripts/bench_scale.py --sizes 10000,100000,1000000 --json runs/scale.json \\
        --embeddings runs/squad1_open/dense/embeddings --model runs/squad1_open/model

At each size N the corpus is the real one (squad1_open's 3,526 passages by default) hidden at seeded
random rows among N - 3,526 synthetic items (`scale_synth.py`):

- BM25 (`dpr.bm25`): synthetic passages with the real word distribution and passage lengths; index
  build time, peak memory, index bytes, queries/s and top-k accuracy of the real test questions.
- FAISS (`dpr.index.build_index` with the `conf/index/{flat,hnsw,ivfpq}.yaml` settings): the real
  passage vectors (``--embeddings``, or encoded with ``--model``) among Gaussian distractors with their
  mean and covariance; build time, peak memory, bytes per passage (saved index), queries/s, and top-k
  accuracy (DPR's has_answer on the real passages; a distractor never holds an answer).
- At the largest size, a sweep of compressed candidates (``--candidates`` × ``--nprobes``) against
  flat; the recommended index is the fastest one that fits ``--budget-gb`` at ``--target`` passages
  and loses at most ``--max-loss`` points of top-k against flat.

Memory is the peak *anonymous* RSS above the level before the build (`scale_stats.PeakRSS`).
Every cost gets a growth law (log-log slope over the sizes) and a projection to ``--target``.

The whole pipeline on such corpora, stage by stage (wall, CPU time, peak RSS, growth laws): `scale_pipeline.py`;
retrieval's peak memory against its index's size: `scale_retrieval.py`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_stats import PeakRSS, growth_table  # noqa: E402
from scale_synth import PassageSampler, gaussian_like, iter_rows, mix_order  # noqa: E402

log = logging.getLogger("bench_scale")

INDEXES = ("flat", "hnsw", "ivfpq")
DEFAULT_CANDIDATES = "IVF4096,PQ48;IVF4096,PQ64;IVF4096,PQ96;IVF1024,PQ64;OPQ64,IVF4096,PQ64"
MEMORY_MEASURE = "peak anonymous RSS above the level before the build (RssAnon, /proc/self/status, sampled every 20 ms)"


def load_real(args: argparse.Namespace, work: Path) -> dict:
    """Real passages, test questions, passage vectors (rows = passage order) and question vectors."""
    from dpr.atomic import atomic_path, write_json_atomic
    from dpr.data.passages import iter_passages
    from dpr.index.fingerprint import model_fingerprint
    from dpr.index.shards import list_shards
    from dpr.data.questions import read_questions
    from dpr.retrieval.runs import encode_questions

    rows = list(iter_passages(args.passages))
    emb = args.embeddings
    if emb is None:  # no vectors given: encode the passages with the model (small corpora, tests)
        from dpr.encode import encode_corpus
        from dpr.encode_config import EncodeConfig

        emb = encode_corpus(args.model, args.passages, work / "real_emb", EncodeConfig(dtype="float32"),
                            cache_dir=work / "arrow", progress=False)
    shards = list_shards(emb)
    vecs = np.concatenate([np.asarray(s.vectors(), dtype=np.float32) for s in shards])
    ids = [pid for s in shards for pid in s.ids()]
    if ids != [r["id"] for r in rows]:
        raise ValueError(f"{emb}: the embeddings' passage ids are not {args.passages}' passages in order")
    pairs = read_questions(args.qa)[: args.queries or None]
    cache = args.question_vectors
    # The cache is reused only for the same model and questions (its sidecar says which), never by row count alone.
    key = {"model": model_fingerprint(args.model),
           "questions": hashlib.sha256("\n".join(q for q, _ in pairs).encode()).hexdigest()}
    sidecar = None if cache is None else cache.with_suffix(cache.suffix + ".json")
    if cache is not None and cache.is_file() and sidecar.is_file() and json.loads(sidecar.read_text()) == key:
        qvecs = np.load(cache)
        log.info("question vectors from %s", cache)
    else:  # encoding ~2,000 questions takes minutes on a busy CPU: --question-vectors keeps them for reruns
        qvecs, _ = encode_questions(args.model, [q for q, _ in pairs])
        if cache is not None:
            with atomic_path(cache) as tmp, open(tmp, "wb") as f:
                np.save(f, qvecs)
            write_json_atomic(sidecar, key)
    return {"rows": rows, "vectors": vecs, "pairs": pairs, "qvecs": np.ascontiguousarray(qvecs, dtype=np.float32),
            "normalized": bool(shards[0].manifest.get("normalized", False))}


class AnswerCheck:
    """Top-k accuracy of a list of hits per question, has_answer cached per (question, text item)."""

    def __init__(self, pairs: list[tuple[str, list[str]]], k: int) -> None:
        self.pairs, self.k, self.cache = pairs, k, {}

    def accuracy(self, hits: list[list], text_of) -> float:
        from dpr.eval.has_answer import has_answer

        found = 0
        for qi, ((_, answers), row) in enumerate(zip(self.pairs, hits)):
            for item in row[: self.k]:
                key = (qi, item)
                if key not in self.cache:
                    text = text_of(item)
                    self.cache[key] = text is not None and has_answer(answers, text)
                if self.cache[key]:
                    found += 1
                    break
        return found / max(1, len(self.pairs))


def bench_bm25(n: int, real: dict, synth: tuple[list[str], list[str]], check: AnswerCheck, seed: int) -> dict:
    from dpr import bm25

    rows, r = real["rows"], len(real["rows"])
    texts = [x["text"] for x in rows] + synth[0][: n - r]
    titles = [x["title"] for x in rows] + synth[1][: n - r]
    ids = [x["id"] for x in rows] + [f"syn{j}" for j in range(n - r)]
    order = mix_order(n, seed + n)
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        index = bm25.build_index_from_rows(iter_rows(order, ids, texts, titles), total=n)
        build_s = time.perf_counter() - t0
    index_bytes = sum(int(sh.scores[key].nbytes) for sh in index.postings() for key in ("data", "indices", "indptr"))
    questions = [q for q, _ in real["pairs"]]
    t0 = time.perf_counter()
    found, _ = bm25.search_indices(index, questions, k=check.k, show_progress=False)
    search_s = time.perf_counter() - t0
    acc = check.accuracy([[int(order[i]) for i in row] for row in found.tolist()], lambda j: texts[j])
    return {"build_s": build_s, "peak_mem_bytes": mem.peak_delta, "index_bytes": index_bytes,
            "bytes_per_passage": index_bytes / n, "ms_per_query": 1e3 * search_s / len(questions),
            "qps": len(questions) / search_s, f"top{check.k}": acc}


def write_mixed_shard(n: int, real: dict, synth_vecs: np.ndarray, out: Path, seed: int) -> list[str]:
    """The real vectors among ``n - R`` distractors, as one `dpr-encode` shard; returns row ids."""
    from dpr.index.shards import write_shard

    r = len(real["rows"])
    order = mix_order(n, seed + n)
    x = np.concatenate([real["vectors"], synth_vecs[: n - r]])[order]
    names = [row["id"] for row in real["rows"]]
    ids = [names[j] if j < r else f"syn{j - r}" for j in order.tolist()]
    write_shard(out, 0, 1, x, ids, model="bench_scale", normalized=real["normalized"])
    return ids


def run_index(emb: Path, params: dict, real: dict, check: AnswerCheck, work: Path,
              nprobes: list[int] | None = None) -> list[dict]:
    """Build one index; search once per ``nprobes`` value (None: the config's own settings)."""
    from dpr.index import build_index, save_index, search, set_search_params
    from dpr.index.build import planned_factory

    with PeakRSS() as mem:
        t0 = time.perf_counter()
        index, ids = build_index(emb, **params)
        build_s = time.perf_counter() - t0
    size = save_index(index, ids, work / "bench.faiss", {"factory": params["factory"]})
    text_of = {row["id"]: row["text"] for row in real["rows"]}.get
    factory = planned_factory(emb, **params)
    out = []
    for nprobe in nprobes or [params.get("nprobe")]:
        set_search_params(index, nprobe=nprobe)
        t0 = time.perf_counter()
        hits, _ = search(index, ids, real["qvecs"], check.k, progress=False)
        search_s = time.perf_counter() - t0
        out.append({"factory": factory, "nprobe": nprobe, "build_s": build_s,
                    "peak_mem_bytes": mem.peak_delta, "index_bytes": size, "bytes_per_passage": size / len(ids),
                    "ms_per_query": 1e3 * search_s / len(hits), "qps": len(hits) / search_s,
                    f"top{check.k}": check.accuracy(hits, text_of)})
    return out


def index_params(name: str, train_sample: int = 0) -> dict:
    """The settings of ``conf/index/<name>.yaml`` (what ``dpr-index index=<name>`` builds)."""
    from omegaconf import OmegaConf

    from dpr.resources import conf_dir

    params = dict(OmegaConf.to_container(OmegaConf.load(conf_dir() / "index" / f"{name}.yaml")))
    if train_sample and "train_sample" in params:
        params["train_sample"] = train_sample
    return params


def recommend(sweep: list[dict], flat_acc: float, k: int, target: int, budget_gb: float,
              max_loss: float) -> dict | None:
    """The fastest candidate within the memory budget at ``target`` and the accuracy loss bound.

    Its search time is projected linearly in N: the accuracy measured at the swept size holds at ``target``
    only if the same share of the corpus is scanned (a fixed nlist and nprobe scan lists that grow with N;
    the default config's fitted law, nprobe fixed while nlist ∝ √N, would keep the time but not the accuracy).
    """
    for c in sweep:
        c["loss_points"] = 100 * (flat_acc - c[f"top{k}"])
        c["memory_at_target_gb"] = c["bytes_per_passage"] * target / 1e9
        c["ms_per_query_at_target"] = c["ms_per_query"] * target / c["size"]
        c["fits"] = c["memory_at_target_gb"] <= budget_gb and c["loss_points"] <= max_loss
    ok = [c for c in sweep if c["fits"]]
    return min(ok, key=lambda c: (c["ms_per_query"], c["bytes_per_passage"])) if ok else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000", help="corpus sizes, comma-separated")
    ap.add_argument("--json", type=Path, required=True, help="write the results here (atomically)")
    ap.add_argument("--data-dir", type=Path, default=REPO / "data" / "prepared")
    ap.add_argument("--dataset", default="squad1_open")
    ap.add_argument("--passages", type=Path, help="default: <data-dir>/<dataset>/passages.tsv")
    ap.add_argument("--qa", type=Path, help="default: <data-dir>/<dataset>/test.qa.tsv")
    ap.add_argument("--model", required=True, help="trained run dir (question vectors; passages without --embeddings)")
    ap.add_argument("--embeddings", type=Path, help="dpr-encode output of --passages (default: encode with --model)")
    ap.add_argument("--question-vectors", type=Path, help="cache of the encoded questions (.npy; read if present)")
    ap.add_argument("--queries", type=int, default=0, help="first N questions only (0 = all)")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--indexes", default=",".join(INDEXES), help="conf/index configs measured at every size")
    ap.add_argument("--hnsw-max-size", type=int, default=0, help="skip HNSW above this size (0 = never skip)")
    ap.add_argument("--candidates", default=DEFAULT_CANDIDATES, help="';'-separated factories swept at the largest size")
    ap.add_argument("--nprobes", default="16,32,64,128")
    ap.add_argument("--target", type=int, default=21_000_000)
    ap.add_argument("--budget-gb", type=float, default=4.0)
    ap.add_argument("--max-loss", type=float, default=1.5, help="top-k points lost against flat")
    ap.add_argument("--train-sample", type=int, default=0,
                    help="IVF/PQ training vectors (0 = conf/index/ivfpq.yaml's); fewer = faster k-means")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    from tqdm.auto import tqdm

    from dpr.atomic import write_json_atomic

    root = args.data_dir / args.dataset
    args.passages, args.qa = args.passages or root / "passages.tsv", args.qa or root / "test.qa.tsv"
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    work = Path(tempfile.mkdtemp(prefix="bench_scale_"))
    try:
        real = load_real(args, work)
        r, k = len(real["rows"]), args.k
        if sizes[0] < r:
            raise SystemExit(f"bench_scale: every size must hold the {r} real passages; got {sizes[0]}")
        check = AnswerCheck(real["pairs"], k)
        log.info("real corpus: %d passages, %d questions, dim %d; synthesising %d items", r, len(real["pairs"]),
                 real["vectors"].shape[1], sizes[-1] - r)
        sampler = PassageSampler([x["text"] for x in real["rows"]], sorted({x["title"] for x in real["rows"]}), args.seed)
        synth = sampler.sample(sizes[-1] - r)
        synth_vecs = gaussian_like(real["vectors"], sizes[-1] - r, seed=args.seed)
        indexes = [i for i in args.indexes.split(",") if i]
        results: dict = {"sizes": {}}
        stages = [(n, s) for n in sizes for s in ["bm25", *indexes]] + [(sizes[-1], "sweep")]
        bar = tqdm(stages, desc="bench_scale", unit="stage")
        emb, flat_acc = work / "emb", None
        for n, stage in bar:
            bar.set_postfix_str(f"{stage} @ {n:,}")
            res = results["sizes"].setdefault(str(n), {})
            if stage == "bm25":
                res["bm25"] = bench_bm25(n, real, synth, check, args.seed)
                shutil.rmtree(emb, ignore_errors=True)
                write_mixed_shard(n, real, synth_vecs, emb, args.seed)
            elif stage == "sweep":
                flat_acc = res["flat"][f"top{k}"] if "flat" in res else None
                results["sweep"] = sweep(args, emb, real, check, work, n)
            elif stage == "hnsw" and args.hnsw_max_size and n > args.hnsw_max_size:
                res["hnsw"] = {"skipped": f"above --hnsw-max-size {args.hnsw_max_size}"}
            else:
                res[stage] = run_index(emb, index_params(stage, args.train_sample), real, check, work)[0]
            if stage != "sweep":
                log.info("%s @ %d: %s", stage, n, res[stage])
            write_json_atomic(args.json, {**results, "complete": False})  # a killed run keeps what it measured
        results.update(summarise(args, sizes, results, flat_acc, k))
        results["config"] = {"sizes": sizes, "real_passages": r, "questions": len(real["pairs"]), "k": k,
                             "dim": int(real["vectors"].shape[1]), "memory_measure": MEMORY_MEASURE,
                             "passages": str(args.passages), "qa": str(args.qa), "model": str(args.model),
                             "target": args.target, "budget_gb": args.budget_gb, "max_loss_points": args.max_loss}
        write_json_atomic(args.json, {**results, "complete": True})
        print(table(results, sizes, ["bm25", *indexes], k))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def sweep(args: argparse.Namespace, emb: Path, real: dict, check: AnswerCheck, work: Path, n: int) -> list[dict]:
    """Every candidate factory × nprobe at size ``n``; factories the data cannot train are recorded as skipped."""
    base = index_params("ivfpq", args.train_sample)
    nprobes = [int(x) for x in args.nprobes.split(",") if x]
    out = []
    for factory in [f for f in args.candidates.split(";") if f]:
        try:
            rows = run_index(emb, {**base, "factory": factory}, real, check, work, nprobes=nprobes)
        except (ValueError, RuntimeError) as err:
            log.warning("candidate %s skipped: %s", factory, err)
            out.append({"factory": factory, "size": n, "skipped": str(err)})
            continue
        out.extend({**row, "size": n} for row in rows)
    return out


def summarise(args: argparse.Namespace, sizes: list[int], results: dict, flat_acc: float | None, k: int) -> dict:
    """Growth laws, the projection to ``--target`` and the recommendation."""
    growth = {}
    for system in ["bm25", *INDEXES]:
        per = [results["sizes"][str(n)].get(system, {}) for n in sizes]
        if not any("build_s" in p for p in per):
            continue
        series = {key: [p.get(key) for p in per] for key in ("build_s", "peak_mem_bytes", "index_bytes", "ms_per_query")}
        growth[system] = growth_table(sizes, series, args.target)
    swept = [c for c in results.get("sweep", []) if "skipped" not in c]
    best = recommend(swept, flat_acc, k, args.target, args.budget_gb, args.max_loss) \
        if swept and flat_acc is not None else None
    # memory: bytes per passage at the largest measured size × target. Index memory is linear in N by
    # construction; a log-log fit bends low when fixed parts (IVF centroids, PQ codebooks) weigh at small N.
    last_bpp = {system: [results["sizes"][str(n)][system]["bytes_per_passage"] for n in sizes
                         if "bytes_per_passage" in results["sizes"][str(n)].get(system, {})][-1] for system in growth}
    projection = {system: {"memory_gb": last_bpp[system] * args.target / 1e9,
                           "memory_gb_fitted": (g["index_bytes"]["at_target"] or 0) / 1e9,
                           "build_hours": (g["build_s"]["at_target"] or 0) / 3600,
                           "ms_per_query": g["ms_per_query"]["at_target"]} for system, g in growth.items()}
    if best is not None:
        # one size measured: its build and search times grow like the ivfpq config's
        exp = growth.get("ivfpq", {}).get("build_s", {}).get("exponent") or 1.0
        projection["recommended"] = {
            "factory": best["factory"], "nprobe": best["nprobe"], "memory_gb": best["memory_at_target_gb"],
            "build_hours": best["build_s"] * (args.target / best["size"]) ** exp / 3600,
            "ms_per_query": best["ms_per_query_at_target"], "loss_points": best["loss_points"],
            "measured_at": best["size"], "exponents_from": "ivfpq"}
    return {"growth": growth, "projection": {"target": args.target, **projection},
            "recommendation": best, "flat_top_at_largest": flat_acc}


def table(results: dict, sizes: list[int], systems: list[str], k: int) -> str:
    head = f"{'size':>10} {'system':<22} {'build s':>9} {'peak MB':>9} {'B/psg':>8} {'q/s':>9} {'top' + str(k):>7}"
    lines = [head, "-" * len(head)]
    fmt = lambda v, f: format(v, f) if isinstance(v, (int, float)) else "-"  # noqa: E731
    for n in sizes:
        for s in systems:
            m = results["sizes"][str(n)].get(s, {})
            lines.append(f"{n:>10,} {s:<22} {fmt(m.get('build_s'), '9.2f')} {fmt((m.get('peak_mem_bytes') or 0) / 2**20, '9.1f')} "
                         f"{fmt(m.get('bytes_per_passage'), '8.1f')} {fmt(m.get('qps'), '9.1f')} {fmt(100 * m.get(f'top{k}', float('nan')), '7.1f')}")
    for c in results.get("sweep", []):
        if "skipped" in c:
            continue
        lines.append(f"{c['size']:>10,} {c['factory'] + '/' + str(c['nprobe']):<22} {c['build_s']:9.2f} "
                     f"{c['peak_mem_bytes'] / 2**20:9.1f} {c['bytes_per_passage']:8.1f} {c['qps']:9.1f} {100 * c[f'top{k}']:7.1f}")
    lines.append("")
    lines.append(f"growth law (cost ∝ N^b) and projection to {results['projection']['target']:,} passages:")
    for s, g in results["growth"].items():
        p = results["projection"][s]
        lines.append(f"  {s:<6} build b={g['build_s']['exponent']}  memory b={g['index_bytes']['exponent']}  "
                     f"search b={g['ms_per_query']['exponent']}  →  {p['memory_gb']:.1f} GB, "
                     f"build {p['build_hours']:.2f} h, {p['ms_per_query'] or 0:.2f} ms/query")
    rec = results["projection"].get("recommended")
    lines.append(f"recommended: {rec['factory']} nprobe={rec['nprobe']}: {rec['memory_gb']:.2f} GB, "
                 f"−{rec['loss_points']:.2f} top-{k} points vs flat, {rec['ms_per_query']:.2f} ms/query"
                 if rec else "recommended: none of the candidates meets the budget and the accuracy bound")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
