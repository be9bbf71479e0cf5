"""``dpr-eval``: side-by-side evaluation of results files (Hydra entry point over `dpr.eval.report`)."""

from __future__ import annotations

import sys
import logging

import hydra
from omegaconf import DictConfig, ListConfig

from dpr.cli.argv import hydra_argv
from dpr.cli.common import CONF_DIR, quiet_interrupt, report_errors
from dpr.eval.config import register_schema

register_schema()  # eval_cfg/default: conf/eval.yaml selects EvalConfig's defaults

log = logging.getLogger(__name__)


def _as_list(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple, ListConfig)):
        return [str(v) for v in value]
    return [str(value)]


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="eval")
@report_errors("dpr-eval", outputs=("output_dir",), schema="eval")
def _run(cfg: DictConfig) -> None:
    from dpr.eval.report import evaluate_qa, evaluate_qrels, system_names

    if int(cfg.resamples) < 1:
        raise ValueError(f"resamples must be >= 1 (bootstrap draws), got {cfg.resamples}")
    paths = _as_list(cfg.results)
    if not paths:
        raise ValueError("no results files: give results=[<file>,...]")
    names = system_names(paths, _as_list(cfg.names) or None)
    by_system = dict(zip(names, paths))
    if cfg.qrels:
        report = evaluate_qrels(by_system, cfg.qrels, cfg.output_dir, num_resamples=cfg.resamples, seed=cfg.seed)
        for name, s in report["systems"].items():
            log.info("%s: %s", name, ", ".join(f"{m}={s[m]:.4f}" for m in report["metrics"]))
    else:
        if cfg.match not in ("string", "regex"):
            raise ValueError(f"match must be 'string' or 'regex', got {cfg.match!r}")
        report = evaluate_qa(by_system, cfg.output_dir, ks=list(cfg.ks), match=cfg.match,
                             num_resamples=cfg.resamples, seed=cfg.seed)
        for name, s in report["systems"].items():
            log.info("%s: %s", name, ", ".join(f"top-{k}={100 * v:.1f}" for k, v in s["top_k"].items()))
    log.info("wrote %s/report.json, report.md, topk.png", cfg.output_dir)


@quiet_interrupt("dpr-eval")
def main() -> None:
    sys.argv = hydra_argv(sys.argv)  # overrides and Hydra's flags in any order
    _run()


if __name__ == "__main__":
    main()
