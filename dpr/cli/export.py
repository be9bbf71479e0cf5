"""``dpr-export model=<run dir> format=sentence-transformers output=<dir>`` (thin Hydra entry point over
`dpr.export`; a `dpr-rerank` cross-encoder directory exports as a sentence-transformers CrossEncoder)."""

from __future__ import annotations

import json
import sys

import hydra
from omegaconf import DictConfig

from dpr.cli.argv import hydra_argv
from dpr.cli.common import CONF_DIR, check_model_path, quiet_interrupt, report_errors
from dpr.export.config import FORMATS, ExportConfig, register_schema
from dpr.trainkit.config_dict import plain

register_schema()  # export_cfg/default: conf/export.yaml selects ExportConfig's defaults

# A built-in sample for check=true: real questions and passages, so a broken export shows.
CHECK_QUESTIONS = ["what is the capital of france", "who wrote hamlet", "how do plants make energy",
                   "what is the largest ocean", "when did the second world war end"]
CHECK_PASSAGES = [("Paris", "Paris is the capital and most populous city of France."),
                  ("Hamlet", "Hamlet is a tragedy written by William Shakespeare around 1600."),
                  ("Photosynthesis", "Photosynthesis converts light energy into chemical energy in plants."),
                  ("Pacific Ocean", "The Pacific Ocean is the largest and deepest of Earth's oceans."),
                  ("", "World War II ended in 1945 with the surrender of Germany and then Japan."),
                  ("Berlin", "Berlin is the capital of Germany.")]


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="export")
@report_errors("dpr-export", outputs=("output",))  # writable, not a file: checked before the export is built
def _run(cfg: DictConfig) -> None:
    from dpr.cli.schemas import check_config
    from dpr.export import compare_export, export_sentence_transformers

    check_config(cfg, ExportConfig)  # types, unknown and missing keys: one line naming the key
    if cfg.format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {cfg.format!r}")
    check_model_path(cfg.model_path)  # missing, or a truncated/corrupt safetensors file: named before any work
    from dpr.rerank.model import is_cross_encoder_dir

    if is_cross_encoder_dir(cfg.model_path):  # a dpr-rerank output: a sentence-transformers CrossEncoder
        if cfg.dim is not None:
            raise ValueError(f"dim={cfg.dim}: a cross-encoder has no vectors to truncate (dim is for retrievers)")
        from dpr.export.cross_encoder import compare_cross_encoder_export, export_cross_encoder

        out = export_cross_encoder(cfg.model_path, cfg.output, model_name=cfg.model_name)
        print(f"dpr-export: {cfg.model_path} → {out} ({cfg.format} CrossEncoder, model card {out / 'README.md'})")
        if cfg.check:
            figures = compare_cross_encoder_export(cfg.model_path, out, CHECK_QUESTIONS, CHECK_PASSAGES)
            print(f"dpr-export: check {json.dumps(figures)}")
        return
    prompts = plain(cfg.prompts)
    out = export_sentence_transformers(cfg.model_path, cfg.output, prompts=prompts, report=cfg.report,
                                       model_name=cfg.model_name, dim=cfg.dim)
    print(f"dpr-export: {cfg.model_path} → {out} ({cfg.format}, model card {out / 'README.md'})")
    if cfg.check:
        figures = compare_export(cfg.model_path, out, CHECK_QUESTIONS, [t for _, t in CHECK_PASSAGES],
                                 titles=[t for t, _ in CHECK_PASSAGES])
        print(f"dpr-export: check {json.dumps(figures)}")


@quiet_interrupt("dpr-export")  # Hydra's composition errors (an unknown key) as one line too
def main() -> None:
    sys.argv = hydra_argv(sys.argv, renames={"model": "model_path"})  # and Hydra's flags in any order
    _run()


if __name__ == "__main__":
    main()
