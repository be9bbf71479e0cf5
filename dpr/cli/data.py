"""``dpr-data data=<name> data_dir=<dir>``: prepare a dataset (thin Hydra entry point over
`dpr.data.prepare.prepare_dataset`)."""

from __future__ import annotations

import sys
import logging

import hydra
from omegaconf import DictConfig

from dpr.cli.argv import hydra_argv
from dpr.cli.common import CONF_DIR, quiet_interrupt, report_errors

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="prepare")
@report_errors("dpr-data", outputs=("data_dir",), schema="prepare")
def _run(cfg: DictConfig) -> None:
    from dpr.data.prepare import prepare_dataset

    root = prepare_dataset(cfg.data, cfg.data_dir, mirror_dir=cfg.data.get("mirror_dir"), force=bool(cfg.force))
    print(root)


@quiet_interrupt("dpr-data")
def main() -> None:
    sys.argv = hydra_argv(sys.argv)  # overrides and Hydra's flags in any order
    _run()


if __name__ == "__main__":
    main()
