"""Skip-if-up-to-date bookkeeping for multi-stage runs (the pipeline).

A stage is up to date when every output it declared exists and its fingerprint (the stage's
parameters plus the size and mtime of each input file) equals the one recorded when it last finished.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from dpr.atomic import write_json_atomic

log = logging.getLogger(__name__)


def _stat(path: Path) -> list:
    """Size and mtime of a file, or of every file below a directory (sorted), so edits are noticed."""
    if path.is_dir():
        return [[str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns]
                for p in sorted(path.rglob("*")) if p.is_file()]
    if path.exists():
        return [path.stat().st_size, path.stat().st_mtime_ns]
    return ["missing"]


def fingerprint(params: Any, inputs: Iterable[str | Path]) -> str:
    blob = json.dumps({"params": params, "inputs": {str(p): _stat(Path(p)) for p in inputs}},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class StageRunner:
    """Runs named stages in order, skipping those whose outputs are present and up to date."""

    state_dir: Path
    force: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def run(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        outputs: Iterable[str | Path],
        inputs: Iterable[str | Path] = (),
        params: Any = None,
    ) -> bool:
        """Run ``fn`` unless the stage is up to date. Returns True when it ran."""
        outputs, inputs = [Path(p) for p in outputs], [Path(p) for p in inputs]
        marker = Path(self.state_dir) / f"{name}.json"
        want = fingerprint(params, inputs)
        if not self.force and marker.exists() and all(p.exists() for p in outputs):
            if json.loads(marker.read_text()).get("fingerprint") == want:
                log.info("[%s] up to date, skipping (outputs: %s)", name, ", ".join(map(str, outputs)))
                self.skipped.append(name)
                self.timings.setdefault(name, json.loads(marker.read_text()).get("seconds", 0.0))
                return False
        log.info("[%s] running", name)
        start = time.perf_counter()
        fn()
        seconds = time.perf_counter() - start
        missing = [str(p) for p in outputs if not p.exists()]
        if missing:
            raise RuntimeError(f"stage {name} finished without writing {missing}")
        # Outputs may be inputs of this stage too (mining rewrites train.json): fingerprint after the run.
        write_json_atomic(marker, {"fingerprint": fingerprint(params, inputs), "seconds": seconds})
        self.timings[name] = seconds
        log.info("[%s] done in %.1f s", name, seconds)
        return True
