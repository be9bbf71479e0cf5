"""`dpr-index embeddings=<dir> output=<file> index=flat|hnsw|ivfpq`: thin Hydra entry point over dpr.index."""

from __future__ import annotations

import sys
import hydra
from omegaconf import DictConfig

from dpr.cli.argv import hydra_argv
from dpr.cli.common import CONF_DIR, quiet_interrupt, report_errors
from dpr.index import build_and_save
from dpr.trainkit.config_dict import plain


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="index")
@report_errors("dpr-index", file_outputs=("output",), file_kinds=("faiss_index",), schema="index")
def _run(cfg: DictConfig) -> None:
    params = plain(cfg.index)
    meta = build_and_save(cfg.embeddings, cfg.output, **params)
    print(f"dpr-index: {meta['count']} passages × {meta['dim']} → {cfg.output} ({meta['factory']}, "
          f"{meta['bytes_per_passage']} bytes/passage, built in {meta['build_seconds']} s)")


@quiet_interrupt("dpr-index")
def main() -> None:
    sys.argv = hydra_argv(sys.argv)  # overrides and Hydra's flags in any order
    _run()


if __name__ == "__main__":
    main()
