"""``dpr-rerank train|score|teacher-scores``: thin Hydra entry point over `dpr.rerank` (config ``conf/rerank.yaml``, schema
`dpr.rerank.config.RerankCommandSchema`).

``model=`` is renamed (``conf/model/`` is a config group, so Hydra would read it as a group choice): for
``score`` it is the cross-encoder to rerank with (``model_path``), for ``train`` the encoder to start from
(``rerank.model``, a name or ``{name, lora}``: `dpr.rerank.config.RerankModelConfig`).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from dpr.cli.argv import hydra_argv
from dpr.cli.common import CONF_DIR, lock_run_dir_of_rank0, quiet_interrupt, report_errors
from dpr.rerank.config import register_schema

log = logging.getLogger(__name__)
COMMANDS = ("train", "score", "teacher-scores")
_command: list[str] = []

register_schema()  # rerank_schema: conf/rerank.yaml extends the RerankCommandSchema dataclass


def _train(cfg: DictConfig) -> None:
    from dpr.rerank.train import as_config, train_cross_encoder

    rcfg = as_config(cfg.rerank)  # range checks before any model is loaded
    if not cfg.output_dir:
        raise ValueError("dpr-rerank train needs output_dir=<dir>")
    train, qrels_source = _training_file(cfg, "train")
    dev, qrels = None, None
    if cfg.dev_results:
        from dpr.data.results import read_results

        dev = read_results(cfg.dev_results)
        qrels = _dev_qrels(dev, qrels_source)
    with lock_run_dir_of_rank0(cfg.output_dir, "dpr-rerank train"):  # a second run into it: refused, exit 2
        summary = train_cross_encoder(rcfg, train, cfg.output_dir, dev=dev, dev_qrels=qrels,
                                      overwrite=bool(cfg.overwrite))
    log.info("cross-encoder: %s (%d steps, %.0f s); best %s", summary["model_dir"], summary["steps"],
             summary["seconds"], json.dumps(summary["best"]) if summary["best"] else "-")


def _training_file(cfg: DictConfig, command: str) -> tuple[Path, Path | None]:
    """``(train.json, the dataset's dev.json or None)``: ``train_file=`` as given, else the dataset's."""
    if cfg.train_file:
        train, dev = Path(cfg.train_file), None
    else:
        from dpr.data.dataset import DatasetPaths

        if cfg.data is None:
            raise ValueError(f"dpr-rerank {command} needs data=<dataset> (or train_file=<DPR retriever JSON>)")
        ds = DatasetPaths.of(cfg.data_dir, cfg.data.name)
        train, dev = ds.train, ds.dev
    if not train.is_file():
        raise FileNotFoundError(f"{train}: no training file (prepare the dataset with dpr-data, mine with dpr-bm25 mine=true)")
    return train, dev


def _dev_qrels(dev: list[dict], dev_json: Path | None) -> dict | None:
    """qrels data: each dev query's judgements, from the dataset's dev.json by ``query_id``."""
    if not any("query_id" in r for r in dev) or dev_json is None or not dev_json.is_file():
        return None
    from dpr.data.retriever_json import read_retriever_json

    return {str(ex["query_id"]): ex["qrels"] for ex in read_retriever_json(dev_json) if "qrels" in ex}


def _score(cfg: DictConfig) -> None:
    from dpr.rerank.rerank_file import rerank_file
    from dpr.rerank.stage_config import WEIGHT
    from dpr.rerank.train import as_config

    rcfg = as_config(cfg.rerank)
    if not cfg.model_path or not cfg.results or not cfg.output:
        raise ValueError("dpr-rerank score needs model=<cross-encoder dir>, results=<DPR results JSON or TREC run> "
                         "and output=<file>")
    if not Path(cfg.results).is_file():
        raise FileNotFoundError(f"{cfg.results}: no such results file")
    grid = None if cfg.weight_grid is None else [float(w) for w in cfg.weight_grid]
    for key, value in [("weight", cfg.weight), *(("weight_grid", w) for w in grid or [])]:
        if not WEIGHT.allows(value):
            raise ValueError(f"{key} must be {WEIGHT.describe()}, got {value!r}")
    queries = passages = qrels = None
    if Path(cfg.results).suffix == ".trec":  # a TREC run names ids: the texts come from the dataset
        queries, passages = _texts(cfg)
    if cfg.qrels:
        from dpr.data.beir import read_qrels

        qrels = read_qrels(cfg.qrels)
    stats = rerank_file(cfg.model_path, cfg.results, cfg.output, rcfg.score, weight=float(cfg.weight),
                        weight_grid=grid, queries=queries, passages=passages, qrels=qrels)
    print(f"dpr-rerank: {cfg.output} {json.dumps(stats)}")


def _texts(cfg: DictConfig) -> tuple[dict, object]:
    """The query texts and passages of ``data=`` (what a TREC run's ids point at)."""
    from dpr.data.dataset import DatasetPaths
    from dpr.rerank.runs import run_texts

    if cfg.data is None:
        raise ValueError(f"{cfg.results}: a TREC run needs data=<dataset> for its query and passage texts")
    return run_texts(DatasetPaths.of(cfg.data_dir, cfg.data.name), cfg.results)


def _teacher_scores(cfg: DictConfig) -> None:
    """The cross-encoder's scores of each training question's candidates (what ``dpr-pipeline teacher=true``
    writes in its ``teacher_scores`` stage), for ``dpr-train loss=kl_distill train.teacher_scores=<file>``."""
    from dpr.rerank.model import resolve_dir
    from dpr.rerank.pipeline import score_training_candidates
    from dpr.rerank.stage_config import TeacherStageConfig
    from dpr.rerank.train import as_config

    rcfg = as_config(cfg.rerank)
    tcfg = TeacherStageConfig(rerank=rcfg)
    if cfg.max_negatives is not None:
        tcfg.max_negatives = cfg.max_negatives
    tcfg.check()  # ranges before any file is read
    if not cfg.model_path or not cfg.output:
        raise ValueError("dpr-rerank teacher-scores needs model=<cross-encoder dir> and output=<teacher_scores.jsonl>")
    train, _ = _training_file(cfg, "teacher-scores")
    manifest = score_training_candidates(resolve_dir(cfg.model_path), train, Path(cfg.output), tcfg)
    print(f"dpr-rerank: {cfg.output} {json.dumps({k: manifest.get(k) for k in ('questions', 'pairs', 'teacher')})}")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="rerank")
@report_errors("dpr-rerank", outputs=("output_dir",), file_outputs=("output",),
               file_kinds=("dpr_results", "trec_run", "teacher_scores"))
def _run(cfg: DictConfig) -> None:
    OmegaConf.resolve(cfg)
    {"train": _train, "score": _score, "teacher-scores": _teacher_scores}[_command[0]](cfg)


@quiet_interrupt("dpr-rerank")
def _hydra_main() -> None:
    _run()


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(f"usage: dpr-rerank {{{'|'.join(COMMANDS)}}} key=value ...", file=sys.stderr)
        sys.exit(2)
    _command[:] = [sys.argv.pop(1)]
    target = "rerank.model" if _command[0] == "train" else "model_path"
    sys.argv = hydra_argv(sys.argv, renames={"model": target})  # and Hydra's flags in any order
    _hydra_main()


if __name__ == "__main__":
    main()
