"""`dpr-pipeline data=<name> data_dir=<dir> output_dir=<dir>`: the whole flow, one report.

``teacher.<key>=v`` is read as ``teacher_cfg.<key>=v`` (``teacher`` itself is the on/off switch).
On a machine with several GPUs (``nproc_per_node``, `dpr.launch`) the command relaunches itself under torchrun,
one rank per GPU, with the same arguments, before it locks the run directory.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from dpr.cli.argv import hydra_argv, refuse_moved, split_argv
from dpr.cli.common import CONF_DIR, launch_dir, lock_run_dir_of_rank0, quiet_interrupt, report_errors
from dpr.bm25.config import register_schema as register_bm25_schema
from dpr.encode_config import register_schema as register_encode_schema
from dpr.launch import processes_to_launch, register_schema as register_launch_schema, relaunch
from dpr.eval.config import register_schema as register_eval_schema
from dpr.negatives.config import moved_from_train, register_schema as register_remine_schema
from dpr.negatives.bm25_config import register_schema as register_mining_schema
from dpr.pipeline_scale import register_schema as register_scale_schema
from dpr.reader.config import register_schema as register_reader_schema
from dpr.rerank.stage_config import register_schema as register_teacher_schema
from dpr.retrieval.config import register_schema as register_retrieve_schema
from dpr.retrieval.fusion import register_schema as register_hybrid_schema
from dpr.training.config import register_schema
from dpr.training.rounds import register_schema as register_rounds_schema

register_schema()  # train/schema: conf/train/*.yaml extend the TrainConfig dataclass
register_bm25_schema()  # bm25_cfg/default, hybrid_cfg/default, eval_cfg/default: the bm25, hybrid and eval
register_hybrid_schema()  # sections' defaults (BM25Config, HybridConfig, EvalConfig), selected by conf/pipeline.yaml
register_eval_schema()
register_encode_schema()  # encode_cfg/pipeline, dense_cfg/default: the encode and dense sections' defaults
register_mining_schema()  # bm25_mine_cfg/pipeline: bm25.k and bm25.num_negatives (BM25MiningConfig)
register_retrieve_schema()  # retrieve_cfg/pipeline: the retrieve section's defaults (RetrieveConfig)
register_teacher_schema()  # teacher_cfg/schema: the TeacherStageConfig dataclass
register_rounds_schema()  # train_rounds/default: train.rounds (PipelineTrainConfig), the pipeline's own train key
register_remine_schema()  # remine_cfg/default: the remine section's defaults (RemineConfig)
register_reader_schema()  # reader_cfg/default: the reader's settings (ReaderConfig), used when reader=true
register_scale_schema()  # scale_cfg/default: the scale section (ScaleConfig): baseline, search device, large-corpus index
register_launch_schema()  # launch_cfg/default: nproc_per_node at the root (LaunchConfig)

MODULE = "dpr.cli.pipeline"
ARGV: list[str] = []  # the arguments as typed, for a relaunch under torchrun (main sets them)

# train.remine_* (once TrainConfig's) → remine.*: refused naming the new key
MOVED = {old: f"use {new} (the re-mining settings left train)" for old, new in moved_from_train().items()}


def teacher_overrides(argv: list[str]) -> list[str]:
    """``teacher.model=X`` → ``teacher_cfg.model=X`` (also with Hydra's ``+``/``++``/``~`` prefixes)."""
    out = []
    for arg in argv:
        head = len(arg) - len(arg.lstrip("+~"))
        out.append(arg[:head] + "teacher_cfg." + arg[head + len("teacher."):]
                   if arg[head:].startswith("teacher.") else arg)
    return out


def job_argv(argv: list[str]) -> list[str]:
    """The arguments that run this Hydra job again: ``argv`` as typed, or for one job of a sweep (``-m``), this
    job's own overrides with the sweep's other flags (``--config-dir`` ...), so each job relaunches itself alone."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return list(argv)
    _, flags = split_argv(argv)
    return [*hydra_cfg.overrides.task, *(f for f in flags if f not in ("-m", "--multirun"))]


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="pipeline")
@report_errors("dpr-pipeline", outputs=("output_dir", "data_dir"), schema="pipeline")
def _run(cfg: DictConfig) -> None:
    nproc, why = processes_to_launch(cfg.get("nproc_per_node", "auto"))
    if nproc > 1:  # before the lock: the relaunched rank 0 takes it
        status = relaunch(nproc, MODULE, job_argv(ARGV), why, cwd=launch_dir())
        if status:
            sys.exit(status)
        return
    from dpr.pipeline import run_pipeline  # heavy imports only once the config is valid

    with lock_run_dir_of_rank0(cfg.output_dir, "dpr-pipeline"):  # one pipeline per output_dir (dpr.run_dir)
        run_pipeline(cfg)


@quiet_interrupt("dpr-pipeline")  # Hydra's composition errors (an unknown key) as one line too
def main() -> None:
    refuse_moved(sys.argv, MOVED)
    ARGV[:] = sys.argv[1:]
    sys.argv = hydra_argv(teacher_overrides(sys.argv))  # teacher.X, and Hydra's flags in any order
    _run()


if __name__ == "__main__":
    main()
