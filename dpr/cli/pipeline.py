"""`dpr-pipeline data=<name> data_dir=<dir> output_dir=<dir>`: the whole flow, one report."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from dpr.cli.common import CONF_DIR, report_errors
from dpr.training.config import register_schema

register_schema()  # train/schema: conf/train/*.yaml extend the TrainConfig dataclass


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="pipeline")
@report_errors("dpr-pipeline", outputs=("output_dir", "data_dir"), schema="pipeline")
def main(cfg: DictConfig) -> None:
    from dpr.pipeline import run_pipeline  # heavy imports only once the config is valid

    run_pipeline(cfg)


if __name__ == "__main__":
    main()
