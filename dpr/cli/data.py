"""``dpr-data``: prepare, export and inspect datasets (thin Hydra entry points).

- ``dpr-data data=<recipe> data_dir=<dir>``: prepare (`dpr.data.prepare.prepare_dataset`; config
  ``conf/prepare.yaml``), e.g. ``data=import data.format=tevatron data.path=train.jsonl data.name=mine``.
- ``dpr-data export data=<name> data_dir=<dir> format=<fmt> output=<file>``: a prepared dataset in a
  peer's format (`dpr.data.formats.export`; ``conf/data_export.yaml``).
- ``dpr-data inspect data=<name> data_dir=<dir> output=<dir>``: what is in a dataset before training on
  it (`dpr.inspect`; ``conf/data_inspect.yaml``).

As in ``dpr-reader train|eval``, the first word picks the config and is removed before Hydra reads the
command line; for export and inspect ``data=<name>`` names a prepared dataset under ``data_dir`` (any
name, also of imported sets that have no ``conf/data/`` file), so it is renamed to ``dataset=``.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from dpr.cli.argv import hydra_argv
from dpr.cli.common import CONF_DIR, quiet_interrupt, report_errors
from dpr.models import BiEncoderConfig
from dpr.training.config import register_schema
from dpr.trainkit.config_dict import plain

log = logging.getLogger(__name__)
COMMANDS = ("export", "inspect")


@dataclass
class ExportSchema:
    dataset: str = MISSING
    data_dir: str = MISSING
    format: str = MISSING
    output: str = MISSING
    split: str = "all"


@dataclass
class InspectCommandSchema:
    dataset: str = MISSING
    data_dir: str = MISSING
    output: str = MISSING
    model: BiEncoderConfig = field(default_factory=BiEncoderConfig)
    train: Any = None    # TrainConfig: batch_size, hard_negatives (checked by TrainConfig.from_dict)
    inspect: Any = None  # dpr.inspect.InspectConfig: thresholds


register_schema()  # conf/train/default.yaml selects train/schema (TrainConfig)


def _register_inspect() -> None:
    from dpr.inspect.config import InspectConfig

    ConfigStore.instance().store(group="inspect", name="default", node=InspectConfig)


_register_inspect()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="prepare")
@report_errors("dpr-data", outputs=("data_dir",), schema="prepare")
def _run(cfg: DictConfig) -> None:
    from dpr.data.prepare import prepare_dataset

    root = prepare_dataset(cfg.data, cfg.data_dir, mirror_dir=cfg.data.get("mirror_dir"), force=bool(cfg.force))
    print(root)


def _check(cfg: DictConfig, schema: type) -> None:
    from dpr.cli.schemas import check_config

    check_config(cfg, schema)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="data_export")
@report_errors("dpr-data export", file_outputs=("output",), file_kinds=("training_export",))
def _export(cfg: DictConfig) -> None:
    from dpr.data.dataset import DatasetPaths
    from dpr.data.formats.export import export_dataset

    _check(cfg, ExportSchema)
    counts = export_dataset(DatasetPaths.of(cfg.data_dir, cfg.dataset).root, str(cfg.format), cfg.output,
                            split=str(cfg.split))
    log.info("export: %s", counts)
    print(cfg.output)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="data_inspect")
@report_errors("dpr-data inspect", outputs=("output",))
def _inspect(cfg: DictConfig) -> None:
    from dpr.data.dataset import DatasetPaths
    from dpr.inspect import inspect_dataset

    _check(cfg, InspectCommandSchema)
    conf = plain(cfg)
    report = inspect_dataset(DatasetPaths.of(cfg.data_dir, cfg.dataset).root, conf, cfg.output)
    for w in report["warnings"]:
        log.warning("%s", w)
    print(cfg.output)


@quiet_interrupt("dpr-data")
def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
        command = sys.argv.pop(1)
        # data=<name> names the prepared dataset here, not a recipe of the data group; Hydra's flags in any order
        sys.argv = hydra_argv(sys.argv, renames={"data": "dataset"})
        (_export if command == "export" else _inspect)()
        return
    sys.argv = hydra_argv(sys.argv)  # overrides and Hydra's flags in any order
    _run()


if __name__ == "__main__":
    main()
