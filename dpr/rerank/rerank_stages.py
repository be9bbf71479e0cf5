"""The pipeline's rerank stages (``dpr-pipeline … teacher=true``): each first stage's top K reranked by the teacher.

In run order (the pipeline's :class:`~dpr.stages.StageRunner`: skipped when up to date): ``rerank_hybrid_dev`` (the
hybrid's dev lists, fused with the dev-tuned weight), ``rerank_dev`` (every depth of ``teacher_cfg.k_grid`` for every
first stage on dev → ``<out>/rerank/dev.json``: K and the interpolation weight chosen there) and ``rerank_<system>``
for bm25, dense and hybrid (→ ``<out>/rerank/<system>/``). The teacher itself is trained and its scores written by
`dpr.rerank.pipeline`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol

from omegaconf import DictConfig

from dpr.atomic import write_json_atomic
from dpr.data.dataset import DatasetPaths
from dpr.rerank.stage_config import TeacherStageConfig
from dpr.stages import StageRunner
from dpr.trainkit.config_dict import plain

log = logging.getLogger(__name__)

FIRST_STAGES = ("bm25", "dense", "hybrid")
SUFFIX = "+rerank"


class Teacher(Protocol):
    """What the rerank stages read of the teacher stages' result (`dpr.rerank.pipeline.TeacherRun`)."""

    teacher_dir: Path


def stage_config(cfg: DictConfig) -> TeacherStageConfig:
    """The pipeline's ``teacher_cfg`` section as the dataclass it is (checked)."""
    return TeacherStageConfig.from_dict(plain(cfg.get("teacher_cfg")))


def dev_qrels(ds: DatasetPaths, split: str) -> dict | None:
    """The qrels of ``split`` on qrels data; None on QA data (answers judge the lists)."""
    if not ds.has_qrels:
        return None
    from dpr.data.beir import read_qrels

    return read_qrels(ds.qrels(split))


class StageTexts:
    """Query and passage texts, loaded once and only where a TREC run has to be turned into records."""

    def __init__(self, ds: DatasetPaths) -> None:
        self.ds, self._q, self._p = ds, None, None

    def records(self, path: Path) -> list[dict]:
        from dpr.rerank.runs import first_stage_records, run_texts

        if path.suffix == ".trec" and self._q is None:
            self._q, self._p = run_texts(self.ds, path)
        return first_stage_records(path, self._q, self._p)

    def inputs(self) -> list[Path]:
        return [self.ds.queries, self.ds.passages] if self.ds.has_qrels else []


@dataclass
class _Reranking:
    """What every rerank stage shares: the teacher's settings, the dataset, where the lists go, the teacher."""

    tcfg: TeacherStageConfig
    ds: DatasetPaths
    rdir: Path                     # <out>/rerank
    stages: StageRunner
    tdir: Path                     # the cross-encoder directory
    texts: StageTexts

    @property
    def qrels_data(self) -> bool:
        return self.ds.has_qrels

    @property
    def metric(self) -> str:
        return "ndcg@10" if self.qrels_data else "mrr"

    @property
    def score_params(self) -> dict:
        return {"precision": self.tcfg.rerank.score.precision}  # the batch size changes the speed, not the scores


@dataclass(frozen=True)
class _SystemFiles:
    """Where one first stage's reranked test list goes: ``<out>/rerank/<system>/``."""

    json: Path
    trec: Path
    stats: Path

    @classmethod
    def of(cls, sdir: Path) -> "_SystemFiles":
        return cls(sdir / "test.json", sdir / "test.trec", sdir / "stats.json")

    def run_file(self, qrels_data: bool) -> Path:
        """The list the report reads: the TREC run on qrels data, else the results JSON."""
        return self.trec if qrels_data else self.json

    def outputs(self, qrels_data: bool) -> list[Path]:
        return [self.json, self.stats, *([self.trec] if qrels_data else [])]


def rerank_stages(cfg: DictConfig, ds: DatasetPaths, out: Path, stages: StageRunner, teacher: Teacher,
                  first: Mapping[str, Mapping[str, Path]], tuning_file: Path) -> tuple[dict[str, Path], dict]:
    """Rerank bm25, dense and hybrid (``first[name] = {"dev": path, "test": path}``, hybrid without dev);
    returns the report's runs ``{"<name>+rerank": test file}`` and the notes (choice of K, dev figures,
    seconds per question)."""
    tcfg = stage_config(cfg)
    job = _Reranking(tcfg, ds, out / "rerank", stages, teacher.teacher_dir, StageTexts(ds))
    dev = _dev_lists(job, cfg, first, tuning_file)
    choice = _choose_depths(job, dev)
    runs: dict[str, Path] = {}
    notes: dict = {"metric": f"{job.metric} on dev", "k_grid": list(tcfg.k_grid), "weight_grid": list(tcfg.weight_grid),
                   "cross_encoder": str(job.tdir),
                   "systems": {}}
    done: list[tuple[Path, int, float | None]] = []  # systems reranked so far: list, depth, seconds per pair
    for name in FIRST_STAGES:
        sysc = choice["systems"][name]
        k, weight = int(sysc["k"]), float(sysc.get("weight", 0.0))
        files = _SystemFiles.of(job.rdir / name)
        keep = _rerank_system(job, name, Path(first[name]["test"]), sysc, files, tuple(done))
        stats = json.loads(files.stats.read_text())
        if not keep:  # a kept list holds no cross-encoder scores for the later systems to reuse
            done.append((files.json, k, stats.get("seconds_per_pair")))
        runs[name + SUFFIX] = files.run_file(job.qrels_data)
        notes["systems"][name + SUFFIX] = {
            "first_stage": name, "k": k, "weight": weight, "kept_first_stage": keep, "dev": sysc["dev"],
            "dev_first_stage": sysc["first_stage"],
            "seconds_per_question": stats["seconds_per_question"], "seconds": stats["seconds"],
            "questions": stats["questions"], "pairs": stats.get("pairs"), "reused_pairs": stats.get("reused")}
    return runs, notes


def _dev_lists(job: _Reranking, cfg: DictConfig, first: Mapping[str, Mapping[str, Path]],
               tuning_file: Path) -> dict[str, Path]:
    """Each first stage's dev list: BM25's and dense's as retrieved, the hybrid's fused with the dev-tuned weight
    (stage ``rerank_hybrid_dev``)."""
    from dpr.retrieval.fusion import fuse_linear

    dev = {name: Path(first[name]["dev"]) for name in ("bm25", "dense")}
    dev["hybrid"] = job.rdir / f"hybrid_dev{'.trec' if job.qrels_data else '.json'}"
    job.stages.run(
        "rerank_hybrid_dev",
        lambda: fuse_linear(dev["bm25"], dev["dense"], json.loads(tuning_file.read_text())["weight"], dev["hybrid"],
                            k=cfg.retrieve.k, normalize=cfg.hybrid.normalize),
        outputs=[dev["hybrid"]], inputs=[dev["bm25"], dev["dense"], tuning_file],
        params={"k": cfg.retrieve.k, "normalize": cfg.hybrid.normalize},
    )
    return dev


def _choose_depths(job: _Reranking, dev: Mapping[str, Path]) -> dict:
    """Stage ``rerank_dev``: each first stage's depth K and interpolation weight, chosen on its dev list
    (``<out>/rerank/dev.json``, read back)."""
    tcfg, choice_file = job.tcfg, job.rdir / "dev.json"
    job.stages.run("rerank_dev", lambda: _choose(job, dev, choice_file), outputs=[choice_file],
                   inputs=[*dev.values(), job.tdir, *job.texts.inputs(),
                           *([job.ds.qrels("dev")] if job.qrels_data else [])],
                   params={"k_grid": list(tcfg.k_grid), "k_tolerance": tcfg.k_tolerance,
                           "weight_grid": list(tcfg.weight_grid), **job.score_params})
    return json.loads(choice_file.read_text())


def _choose(job: _Reranking, dev: Mapping[str, Path], choice_file: Path) -> None:
    from dpr.rerank.model import load_cross_encoder
    from dpr.rerank.runs import choose_k, choose_weight, pair_scores, reranked
    from dpr.rerank.validate import results_metrics

    tcfg, s, metric = job.tcfg, job.tcfg.rerank.score, job.metric
    k_grid, weight_grid = list(tcfg.k_grid), list(tcfg.weight_grid)
    model, tok, settings = load_cross_encoder(job.tdir)
    qrels = dev_qrels(job.ds, "dev")
    records = {name: job.texts.records(dev[name]) for name in FIRST_STAGES}
    scores = pair_scores(model, tok, settings, list(records.values()), max(k_grid),
                         batch_size=s.batch_size, precision=s.precision)  # one score per distinct pair
    body: dict = {"metric": metric, "k_grid": k_grid, "weight_grid": weight_grid,
                  "systems": {}}
    for name, recs in records.items():
        # per depth: the interpolation weight tuned on dev, then the depth chosen on the tuned figures
        by_kw = {k: {w: results_metrics(reranked(recs, scores, k, w), qrels) for w in weight_grid}
                 for k in k_grid}
        weight_at = {k: choose_weight(per_w, metric) for k, per_w in by_kw.items()}
        per_k = {k: by_kw[k][weight_at[k]] for k in k_grid}
        k = choose_k(per_k, metric, tcfg.k_tolerance)
        body["systems"][name] = {"k": k, "weight": weight_at[k],
                                 "first_stage": results_metrics(recs, qrels),
                                 "dev": {str(k): v for k, v in per_k.items()},
                                 "dev_by_weight": {str(k): {str(w): v[metric] for w, v in per_w.items()}
                                                   for k, per_w in by_kw.items()}}
    write_json_atomic(choice_file, body)


def _rerank_system(job: _Reranking, name: str, test: Path, sysc: Mapping, files: _SystemFiles,
                   before: tuple[tuple[Path, int, float | None], ...]) -> bool:
    """Stage ``rerank_<name>``: the first stage's test list reranked at its chosen depth and weight, or kept as it
    is when reranking lowered it on dev (``teacher_cfg.keep_first_stage``); whether it was kept."""
    from dpr.rerank.runs import keep_first_stage, lowers_dev

    k, weight, metric, qrels_data = int(sysc["k"]), float(sysc.get("weight", 0.0)), job.metric, job.qrels_data
    keep = job.tcfg.keep_first_stage and lowers_dev(sysc, metric)
    if keep:  # reranking lowered it on dev: the row is the first stage's own list, scored by nobody
        log.info("rerank_%s: dev %s %.4f reranked < %.4f as it is: the first stage's list is kept", name,
                 metric, sysc["dev"][str(k)][metric], sysc["first_stage"][metric])
        job.stages.run(f"rerank_{name}",
                       lambda: keep_first_stage(test, files.json, files.trec if qrels_data else None, files.stats,
                                                job.texts.records(test)),
                       outputs=files.outputs(qrels_data), inputs=[test, *job.texts.inputs()],
                       params={"kept_first_stage": True})
    else:
        job.stages.run(f"rerank_{name}", lambda: _rerank_test(job, name, test, k, weight, files, before),
                       outputs=files.outputs(qrels_data), inputs=[test, job.tdir, *job.texts.inputs()],
                       params={"k": k, **({"weight": weight} if weight else {}), **job.score_params})
    return keep


def _rerank_test(job: _Reranking, name: str, test: Path, k: int, weight: float, files: _SystemFiles,
                 before: tuple[tuple[Path, int, float | None], ...]) -> None:
    from dpr.data.results import read_results
    from dpr.rerank.model import load_cross_encoder
    from dpr.rerank.rerank_file import write_reranked_set
    from dpr.rerank.runs import known_pairs, timed_rerank

    s = job.tcfg.rerank.score
    model, tok, settings = load_cross_encoder(job.tdir)
    # a pair's logit depends on the teacher and the pair only (this run's teacher: the stages
    # before this one are up to date with it), so the other systems' reranked lists are a cache
    known: dict = {}
    for path, depth, _ in before:
        known.update(known_pairs(read_results(path), depth))
    recs, stats = timed_rerank(model, tok, settings, job.texts.records(test), k, batch_size=s.batch_size,
                               precision=s.precision, known=known, weight=weight)
    if stats["seconds_per_question"] is None:  # every pair was reused: price them at the others' rate
        rates = [r for _, _, r in before if r]
        rate = sum(rates) / max(1, len(rates))
        stats["seconds_per_question"] = round(rate * stats["pairs"] / max(1, stats["questions"]), 5)
    write_reranked_set(recs, files.json, files.trec if job.qrels_data else None, files.stats,
                       {**stats, "first_stage": str(test)}, tag=f"{name}_rerank{k}")
