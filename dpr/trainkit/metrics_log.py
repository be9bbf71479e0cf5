"""Where training metrics go: ``metrics.jsonl`` / ``validation.jsonl`` in the output dir, and wandb -- every
trainer's (the retriever's, the reader's, the cross-encoder's).

A resumed run's files lose the rows after the step it resumes from (it logs those steps again, identically); a
fresh run's start empty. Only the main process logs (the retriever's trainer passes ``enabled=False`` elsewhere). wandb runs offline unless
``WANDB_MODE`` says otherwise, so it never asks for an API key; ``logger=none`` turns it off.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any

from dpr.atomic import write_text_atomic

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
VALIDATION_FILE = "validation.jsonl"
WANDB_ID_FILE = "wandb_run_id.txt"


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Drop rows logged after ``max_step``: a resumed run logs those steps again (identically)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        if int(row.get("step", 0)) <= max_step:
            kept.append(line)
    write_text_atomic(path, "".join(f"{line}\n" for line in kept))


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a metrics file (what tests, sweeps and the bench read back)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class MetricsLogger:
    """Appends one JSON object per logged step and mirrors it to wandb when asked.

    Holds the open files and the wandb run, hence a class. ``validation=False``: a trainer that never validates
    (the reader) writes no ``validation.jsonl``.
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        enabled: bool = True,
        wandb_cfg: dict | None = None,
        run_config: dict | None = None,
        resume_step: int = 0,
        validation: bool = True,
    ) -> None:
        self.enabled = enabled
        self.output_dir = Path(output_dir)
        self._wandb_run = None
        self._files: dict[str, Any] = {}
        if not enabled:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        for name in (METRICS_FILE, VALIDATION_FILE) if validation else (METRICS_FILE,):
            path = self.output_dir / name
            if resume_step > 0:
                truncate_jsonl(path, resume_step)
            elif path.exists():
                path.unlink()  # a fresh run never mixes its rows with an old run's
            self._files[name] = open(path, "a", encoding="utf-8")
        if wandb_cfg:
            self._wandb_run = _init_wandb(self.output_dir, wandb_cfg, run_config or {}, resume_step > 0)

    def log_train(self, step: int, metrics: dict) -> None:
        self._write(METRICS_FILE, step, metrics, prefix="train/")

    def log_validation(self, step: int, metrics: dict) -> None:
        self._write(VALIDATION_FILE, step, metrics, prefix="val/")

    def _write(self, name: str, step: int, metrics: dict, prefix: str) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), **{k: _scalar(v) for k, v in metrics.items()}}
        f = self._files[name]
        f.write(json.dumps(row) + "\n")
        f.flush()
        if self._wandb_run is not None:
            self._wandb_run.log({f"{prefix}{k}": v for k, v in row.items() if k != "step"}, step=int(step))

    def summary(self, values: dict) -> None:
        if self._wandb_run is not None:
            for k, v in values.items():
                if isinstance(v, (int, float, str, bool)):
                    self._wandb_run.summary[k] = v

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files = {}
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None


def _scalar(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    return v


def _init_wandb(output_dir: Path, cfg: dict, run_config: dict, resuming: bool):
    import wandb

    # A resumed run continues the same wandb run: its id is kept beside the metrics.
    id_file = output_dir / WANDB_ID_FILE
    # (secrets, not random: logging must not advance the training RNG)
    run_id = id_file.read_text().strip() if resuming and id_file.is_file() else secrets.token_hex(4)
    write_text_atomic(id_file, run_id)
    mode = os.environ.get("WANDB_MODE", cfg.get("mode") or "offline")
    run = wandb.init(
        project=cfg.get("project") or "dpr",
        entity=cfg.get("entity"),
        name=cfg.get("name"),
        group=cfg.get("group"),
        tags=list(cfg.get("tags") or []),
        config=run_config,
        dir=str(output_dir),
        mode=mode,
        id=run_id,
        resume="allow",
        settings=wandb.Settings(console="off", silent=True),
    )
    log.info("wandb run %s (mode=%s) in %s/wandb", run_id, mode, output_dir)
    return run
