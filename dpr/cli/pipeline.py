"""`dpr-pipeline data=<name> data_dir=<dir> output_dir=<dir>`: the whole flow, one report."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from dpr.cli.argv import hydra_argv
from dpr.cli.common import CONF_DIR, report_errors
from dpr.training.config import register_schema

register_schema()  # train/schema: conf/train/*.yaml extend the TrainConfig dataclass


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="pipeline")
@report_errors("dpr-pipeline", outputs=("output_dir", "data_dir"), schema="pipeline")
def _run(cfg: DictConfig) -> None:
    from dpr.pipeline import run_pipeline  # heavy imports only once the config is valid

    run_pipeline(cfg)


def main() -> None:
    sys.argv = hydra_argv(sys.argv)  # overrides and Hydra's flags in any order
    _run()


if __name__ == "__main__":
    main()
