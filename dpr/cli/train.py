"""``dpr-train``: Hydra entry point over :func:`dpr.training.train.train`.

Single run: everything lands in ``output_dir`` (``hydra.run.dir``). Multirun (``-m``): each job writes
to ``<output_dir>/<overrides>/`` and :class:`SweepSummaryCallback` writes ``sweep_summary.{md,json,csv}``
in ``<output_dir>`` when the sweep ends. Under torchrun every rank runs Hydra; ranks other than 0
are pointed at ``hydra.run.dir=.`` without ``.hydra/`` or a log file, so only rank 0 writes outputs.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from dpr.bm25.config import register_schema as register_bm25_schema
from dpr.cli import hydra_staging
from dpr.cli.argv import hydra_argv, refuse_moved, shows_only, split_argv
from dpr.cli.common import CONF_DIR, check_output_dir, lock_run_dir_of_rank0, quiet_interrupt, report_errors
from dpr.negatives.config import moved_from_train
from dpr.training.config import register_schema
from dpr.trainkit.config_dict import plain

log = logging.getLogger(__name__)


def _swept_keys(argv: list[str]) -> set[str]:
    """Keys a multirun sweeps over, as typed: ``a=1,2`` or ``a=range(..)``/``choice(..)``/``glob(..)``."""
    keys = set()
    for arg in argv[1:]:
        key, sep, value = arg.partition("=")
        if not sep or key.startswith("-"):
            continue
        depth, top_comma = 0, False
        for ch in value:
            depth += ch in "[({"
            depth -= ch in "])}"
            top_comma |= ch == "," and depth == 0
        if top_comma or re.match(r"^(range|choice|glob|interval)\(", value):
            keys.add(key.lstrip("+~"))
    return keys


def sweep_subdir(job_num: int, override_dirname: str, argv: list[str] | None = None) -> str:
    """A sweep job's directory name: ``<job num>_<swept overrides>``, e.g. ``1_train.lr=3e-05``.

    Only the swept keys are named (the constant overrides are the same in every run, and are in
    ``.hydra/overrides.yaml``); the name is one path component (override values can be paths) and
    short enough for any file system; the job number keeps it unique.
    """
    swept = _swept_keys(sys.argv if argv is None else argv)
    items = [i for i in str(override_dirname).split(",") if i.partition("=")[0] in swept] or [str(override_dirname)]
    safe = re.sub(r"[^A-Za-z0-9._=,+-]+", "_", ",".join(items)).strip("_")
    return f"{job_num}_{safe[:120]}" if safe else str(job_num)


# Resolvers must exist before Hydra composes conf/train.yaml (hydra.sweep.subdir uses this one).
OmegaConf.register_new_resolver("dpr_sweep_subdir", sweep_subdir, replace=True)


class SweepSummaryCallback(Callback):
    """After a multirun: one table of overrides × final metrics at the sweep directory. Before it: what the sweep
    directory holds (`dpr.cli.hydra_staging.note_sweep`: a refused job removes only what Hydra made for it)."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        hydra_staging.note_sweep(config.hydra.sweep.dir)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from dpr.training.sweep import write_sweep_summary

        write_sweep_summary(config.hydra.sweep.dir)


register_schema()  # train/schema: conf/train/*.yaml extend the TrainConfig dataclass
register_bm25_schema()  # bm25_cfg/default: conf/train.yaml's bm25 section (the BM25 teacher's settings)

# Re-mining rounds are the pipeline's (one dpr-train run is one round): its keys are not TrainConfig's.
MOVED = {"train.rounds": "re-mining rounds run in dpr-pipeline (dpr-pipeline train.rounds=N)",
         **{old: f"re-mining runs in dpr-pipeline (dpr-pipeline {new}=...)" for old, new in moved_from_train().items()}}


def check_steps(cfg: DictConfig) -> None:
    """Refuse a run that would take no optimiser step: it would save the starting weights as a trained run."""
    from dpr.data.dataset import DatasetPaths
    from dpr.training.example_file import count_records

    from dpr.training.config import TrainConfig

    t = cfg.train
    TrainConfig.from_dict(plain(t))  # its own checks: zero steps, bad values
    max_steps, epochs = int(t.get("max_steps", 0) or 0), int(t.get("epochs", 0) or 0)
    if max_steps == 0 and epochs > 0:  # epochs decide: the incomplete last batch is dropped
        world = int(os.environ.get("WORLD_SIZE", "1"))
        per_step = int(t.batch_size) * world * int(t.get("grad_accumulation_steps", 1) or 1)
        train_file = DatasetPaths.of(cfg.data_dir, cfg.data.name).train
        if train_file.is_file():
            n = count_records(train_file)  # streamed: the file is never held whole
            if n < per_step:
                raise ValueError(f"{train_file}: {n} training questions make zero steps per epoch at "
                                 f"{per_step} questions per step (train.batch_size x devices x accumulation)")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def _run(cfg: DictConfig) -> None:
    from dpr import run_dir

    # In a sweep each job's own directory (sweep dir / subdir) is its output_dir.
    out = HydraConfig.get().runtime.output_dir
    try:
        _locked_run(cfg, out)
    finally:  # refused (also by report_errors' own checks) or failed: this run's pending .hydra/ goes, the
        run_dir.discard_hydra_dir(out)  # finished run's stays (once committed, nothing pending is left)
        hydra_staging.abandon(out)  # and a run directory Hydra made for a refused run, while empty


@report_errors("dpr-train")
def _locked_run(cfg: DictConfig, out: str) -> None:
    # rank 0 owns the run directory (the other ranks write nothing there); a second run into it stops here
    with lock_run_dir_of_rank0(out, "dpr-train"):
        _checked_start(cfg, out)
        _train(cfg, HydraConfig.get(), out)


def _checked_start(cfg: DictConfig, out: str) -> None:
    """Every check that must pass before the run directory is touched; then Hydra's .hydra/ is committed."""
    from dpr import run_dir
    from dpr.cli.schemas import SCHEMAS, check_config

    from dpr.data.dataset import DatasetPaths
    from dpr.models.backbone import check_trainable_dtype
    from dpr.models.biencoder import BiEncoderConfig

    check_config(cfg, SCHEMAS["train"])
    hydra_staging.check_log(out)
    check_steps(cfg)
    model_cfg = BiEncoderConfig.from_dict(plain(cfg.model))  # the model keys' ranges
    check_trainable_dtype(model_cfg.dtype, model_cfg.lora)  # bf16 weights train only as LoRA
    paths = DatasetPaths.of(cfg.data_dir, cfg.data.name)
    train_file = Path(cfg.get("train_file") or paths.train)  # as dpr.training.train resolves it
    if not train_file.is_file():
        raise FileNotFoundError(f"{train_file}: no training data (prepare it with dpr-data data={cfg.data.name})")
    conf = plain(cfg)
    conf["output_dir"] = out
    state = run_dir.prepare_run_dir(out, conf, overwrite=bool(cfg.get("overwrite", False)),
                                    data=run_dir.data_fingerprints(train_file, paths.dev))
    run_dir.commit_hydra_dir(out)  # a sweep job's pending .hydra/ (inside its directory)
    hydra_staging.commit(out)  # a single run's log and .hydra/ (staged outside it)
    log.info("run directory %s: %s", out, state)


def _train(cfg: DictConfig, hc, out: str) -> None:
    from dpr.training.train import train

    cfg.output_dir = out
    _warn_about_the_data(cfg)
    extra = {"overrides": list(hc.overrides.task)}
    if hc.mode == RunMode.MULTIRUN:
        extra["job_num"] = hc.job.num
    summary = train(cfg, extra_summary=extra)
    log.info("done: %d steps, final weights: %s, %s", summary["steps"], summary["final_weights"], summary["final_metrics"])


def _warn_about_the_data(cfg: DictConfig) -> None:
    """The findings of ``dpr-data inspect`` that predict a failed training (no negatives, false negatives,
    truncation, a teacher that does not separate), logged once by rank 0 before any step; a seeded sample of
    the corpus is tokenized (~25 s on squad1_open's 3.5k passages on 2 cores). Skipped for a ``train_file``
    given by hand: the findings are about the prepared dataset's own train.json."""
    if cfg.get("train_file") or int(os.environ.get("RANK", "0")) != 0:
        return
    from dpr.data.dataset import DatasetPaths
    from dpr.inspect import dataset_warnings

    for warning in dataset_warnings(DatasetPaths.of(cfg.data_dir, cfg.data.name).root, cfg):
        log.warning("%s (dpr-data inspect data=%s data_dir=%s output=<dir> for the report)", warning,
                    cfg.data.name, cfg.data_dir)


def _quiet_nonzero_rank(argv: list[str], stage: bool = False) -> list[str]:
    """The command line for Hydra (:func:`dpr.cli.argv.hydra_argv`: overrides and Hydra's flags in any order).

    torchrun ranks > 0: no run dir, no ``.hydra/``, console logging only (rank 0 writes the outputs).
    Rank 0 of a single run: Hydra's log and ``.hydra/`` go to a staging directory outside the run directory,
    moved in once the run's checks pass (`dpr.cli.hydra_staging`); of a sweep: each job's log is staged the same
    way and its ``.hydra/`` goes to ``.hydra.pending/`` first, committed the same way (`dpr.run_dir`); unless the
    user chose Hydra's logging or ``hydra.output_subdir`` themselves. ``stage``: False for a command line Hydra only prints (``--cfg``...).
    """
    if int(os.environ.get("RANK", "0")) == 0:
        from dpr.run_dir import pending_hydra_name

        overrides, flags = split_argv(argv[1:])
        staged = hydra_staging.stage_overrides(overrides, flags) if stage else None
        return hydra_argv(argv, {"hydra.output_subdir": pending_hydra_name(), **(staged or {})})
    return hydra_argv(argv, {"hydra.run.dir": ".", "hydra.output_subdir": "null", "hydra/job_logging": "stdout"})


def _check_output_dir(argv: list[str]) -> None:
    """Hydra creates the run directory before any code of ours runs (and answers a failure with a
    traceback): check the place is writable first, from the command line (default: runs/train/)."""
    given = [a.split("=", 1)[1] for a in argv[1:] if a.split("=", 1)[0].lstrip("+~") in ("output_dir", "hydra.run.dir")
             and "=" in a]
    target = given[-1] if given and "${" not in given[-1] else "runs/train"
    try:
        if given and not given[-1].strip():
            raise ValueError("config key output_dir: an empty path; give a directory")
        check_output_dir(target, "output_dir")
        if given and "${" not in given[-1]:  # a running run's directory: refused before Hydra writes its log there
            from dpr.run_dir import check_run_dir_free

            check_run_dir_free(target)
    except (OSError, ValueError) as err:
        print(f"dpr-train: error: {err}", file=sys.stderr)
        sys.exit(2)


@quiet_interrupt("dpr-train")
def main() -> None:
    refuse_moved(sys.argv, MOVED)
    runs = not shows_only(sys.argv)
    if int(os.environ.get("RANK", "0")) == 0 and runs:
        _check_output_dir(sys.argv)
    try:
        sys.argv = _quiet_nonzero_rank(sys.argv, stage=runs)
        _run()
    finally:
        hydra_staging.discard()


if __name__ == "__main__":
    main()
