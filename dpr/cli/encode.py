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
    from dpr.encode import encode_corpus

    check_model_path(cfg.model_path)
    out = encode_corpus(
        cfg.model_path, cfg.passages, cfg.output_dir,
        shard_id=cfg.shard_id, num_shards=cfg.num_shards, batch_size=cfg.batch_size, dtype=cfg.dtype,
        autocast=cfg.autocast, quantize=cfg.quantize, runtime=cfg.runtime, device=cfg.device, max_length=cfg.max_length,
        chunk_size=cfg.chunk_size, weights=cfg.weights, compile=cfg.compile, length_sort=cfg.length_sort,
    )
    print(f"dpr-encode: embeddings in {out}")


@quiet_interrupt("dpr-encode")
def main() -> None:
    sys.argv = hydra_argv(sys.argv, renames={"model": "model_path"})  # and Hydra's flags in any order
    _run()


if __name__ == "__main__":
    main()
