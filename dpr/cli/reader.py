"""``dpr-reader train|eval``: thin Hydra entry point over `dpr.reader` (config ``conf/reader.yaml``).

``model=`` is renamed (``conf/model/`` is a config group, so Hydra would read it as a group choice):
for ``eval`` it is the reader to evaluate (``reader_model``), for ``train`` the encoder to start from
(``reader_cfg.model``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from dpr.cli.argv import hydra_argv, split_argv
from dpr.cli.common import CONF_DIR, lock_run_dir_of_rank0, quiet_interrupt, report_errors
from dpr.reader.config import register_schema

register_schema()  # reader_cfg/default: the reader's settings (ReaderConfig), selected by conf/reader.yaml

log = logging.getLogger(__name__)
COMMANDS = ("train", "eval")
_command: list[str] = []


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="reader")
@report_errors("dpr-reader", outputs=("output_dir",), file_outputs=("output",),
               file_kinds=("reader_eval",), schema="reader")
def _run(cfg: DictConfig) -> None:
    from dpr.data.dataset import DatasetPaths

    ds = DatasetPaths.of(cfg.data_dir, cfg.data.name)
    if _command[0] == "train":
        from dpr.reader.train import train_reader

        if not ds.train.is_file():
            raise FileNotFoundError(f"{ds.train}: no training file (prepare the dataset with dpr-data first)")
        with lock_run_dir_of_rank0(cfg.output_dir, "dpr-reader train"):  # a second run into it: refused, exit 2
            summary = train_reader(cfg.reader_cfg, ds.train, cfg.output_dir, overwrite=bool(cfg.get("overwrite", False)))
        log.info("reader: %s (%d steps, %.0f s); data %s", summary["model_dir"], summary["steps"],
                 summary["seconds"], summary["data"])
        return
    from dpr.reader.evaluate import evaluate_reader

    if not cfg.reader_model or not cfg.output:
        raise ValueError("dpr-reader eval needs model=<reader dir> and output=<file>")
    if not cfg.results and not cfg.gold_split:
        raise ValueError("dpr-reader eval needs results=<DPR results JSON> and/or gold_split=<split>")
    out = evaluate_reader(cfg.reader_cfg, Path(cfg.reader_model), Path(cfg.output),
                          results=Path(cfg.results) if cfg.results else None,
                          gold=(ds, str(cfg.gold_split)) if cfg.gold_split else None)
    for setting, figures in out["figures"].items():
        log.info("%s: %s", setting, figures)


@quiet_interrupt("dpr-reader")  # Hydra's composition errors (an unknown key) as one line too
def main() -> None:
    # the command may stand anywhere among the overrides and Hydra's flags (dpr-reader --cfg job train ...)
    overrides, flags = split_argv(sys.argv[1:])
    command = next((a for a in overrides if a in COMMANDS), None)
    if command is None:
        usage = f"usage: dpr-reader {{{'|'.join(COMMANDS)}}} key=value ... [Hydra flags: --cfg job, --help ...]"
        asked = any(f in ("--help", "-h") for f in flags)
        print(usage, file=sys.stdout if asked else sys.stderr)
        sys.exit(0 if asked else 2)
    _command[:] = [command]
    overrides.remove(command)
    # train: model= is the encoder to start from; eval: the trained reader to evaluate
    target = "reader_cfg.model" if command == "train" else "reader_model"
    sys.argv = hydra_argv([sys.argv[0], *overrides, *flags], renames={"model": target})
    _run()


if __name__ == "__main__":
    main()
