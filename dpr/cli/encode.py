"""`dpr-encode model=<run dir> passages=<tsv> output_dir=<dir> shard_id=<i> num_shards=<n>`."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from dpr.cli.argv import hydra_argv
from dpr.cli.common import CONF_DIR, quiet_interrupt, rename_overrides, report_errors  # noqa: F401 (re-exported)
from dpr.encode_config import register_schema

register_schema()  # encode_cfg/default: conf/encode.yaml selects EncodeConfig's defaults


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="encode")
@report_errors("dpr-encode", outputs=("output_dir",), schema="encode")
def _run(cfg: DictConfig) -> None:
    from dpr.cli.common import check_model_path
    from dpr.config import fields_from
    from dpr.encode import encode_corpus
    from dpr.encode_config import EncodeConfig

    check_model_path(cfg.model_path)
    # the root holds EncodeConfig's keys (selected from it by conf/encode.yaml) beside the command's own
    out = encode_corpus(cfg.model_path, cfg.passages, cfg.output_dir, fields_from(EncodeConfig, cfg),
                        shard_id=cfg.shard_id, num_shards=cfg.num_shards)
    print(f"dpr-encode: embeddings in {out}")


@quiet_interrupt("dpr-encode")
def main() -> None:
    sys.argv = hydra_argv(sys.argv, renames={"model": "model_path"})  # and Hydra's flags in any order
    _run()


if __name__ == "__main__":
    main()
