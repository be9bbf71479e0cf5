"""Skip-if-up-to-date bookkeeping for multi-stage runs (the pipeline).

A stage is up to date when every output it declared exists and its fingerprint (the stage's
parameters plus the size and mtime of each input file) equals the one recorded when it last finished.

Paths inside the run directory (the parent of ``StageRunner.state_dir``) enter the
fingerprint relative to it, so a run directory moved (``mv``, or copied keeping mtimes: ``cp -a``, ``rsync -a``)
or named another way (relative against absolute) is still up to date; inputs elsewhere (the dataset) count by
their own path. Markers written before that rule (whole paths) are still recognised, and rewritten in the new
form the first time they are checked.

A marker also records what the stage wrote (``outputs``: per output, a hash of the size and mtime of the file, or
of every file below the directory, dot-files aside). A stage whose inputs and parameters are unchanged but whose
outputs were since rewritten by something else (``dpr-train overwrite=true output_dir=<a pipeline's model/>``) is
neither called up to date nor run over: `StageOutputsChanged` names the output, in one line, before anything of it
is touched; removing it runs the stage again. A stage whose inputs or parameters changed runs and replaces its
outputs, as always. Markers written before outputs were recorded are accepted as they are and gain the record the
first time a single process finds them up to date.

Under a launcher of several processes, a stage that every rank runs is written by every rank, so no one process
knows by itself which copy is the last. Each rank leaves a token (``.<stage>.done.<rank>`` beside the markers,
naming the launch) once its part is done; rank 0 waits for all of them, then records the outputs and writes the
marker alone (`_record_after_every_rank`). Where nothing in the environment names the launch (a token of an earlier
launch could not be told from this one's), or the tokens do not all come within ``StageRunner.record_wait_s``, the
marker records no outputs, as from every rank before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from dpr.atomic import write_json_atomic, write_text_atomic
from dpr.errors import DataError

log = logging.getLogger(__name__)


def _stat(path: Path) -> list:
    """Size and mtime of a file, or of every file below a directory (sorted), so edits are noticed."""
    if path.is_dir():
        return [[str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns]
                for p in sorted(path.rglob("*")) if p.is_file()]
    if path.exists():
        return [path.stat().st_size, path.stat().st_mtime_ns]
    return ["missing"]


RUN = "<run>"  # what the run directory's path is replaced by in a fingerprint


def _run_forms(root: Path) -> list[str]:
    """The spellings of ``root`` a stage's paths may use: as given, normalised, and absolute (longest first)."""
    forms = {str(root), os.path.normpath(str(root)), os.path.abspath(str(root)), str(Path(root).resolve())}
    return sorted((f for f in forms if f not in (".", "/")), key=len, reverse=True)


def _relative(text: str, forms: list[str]) -> str:
    """``text`` with each spelling of the run directory, where it is a whole path component, replaced by RUN."""
    for form in forms:
        text = re.sub(r"(?<![\w.~/-])" + re.escape(form) + r"(?=[/\\\"]|$)", RUN, text)
    return text


def fingerprint(params: Any, inputs: Iterable[str | Path], root: str | Path | None = None) -> str:
    """A stage's fingerprint: ``params`` plus the size and mtime of each input; with ``root``, every path under
    it counts relative to it (module doc). Without ``root``: whole paths, the rule of markers written before."""
    forms = _run_forms(Path(root)) if root is not None else []
    # Input paths made relative before the dump: sort_keys must order them the same wherever the run lives.
    stats = {_relative(str(p), forms): _stat(Path(p)) for p in inputs}
    blob = json.dumps({"params": params, "inputs": stats}, sort_keys=True, default=str)
    return hashlib.sha256(_relative(blob, forms).encode()).hexdigest()


def output_state(path: Path) -> str:
    """What a stage's output holds, cheaply: a hash of the size and mtime of the file, or of every file below the
    directory (by its path inside it, so a moved run keeps it; dot-files, which locks and temporary files are, left
    out). Any rewrite changes it; a copy keeping mtimes (``cp -a``) does not."""
    stats = _stat(path)
    if path.is_dir():
        stats = [s for s in stats if not any(part.startswith(".") for part in Path(s[0]).parts)]
    return hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:32]


def _place(outputs: list[Path], root: Path, changed: Path) -> Path:
    """What a refusal names: the directory holding all of a stage's outputs (a model's marker file and its tower)
    where that is a folder of the run directory, else the changed output itself."""
    if len(outputs) > 1:
        common = Path(os.path.commonpath([os.path.abspath(p) for p in outputs]))
        run = Path(os.path.abspath(root))
        if common != run and run in common.parents and common not in {Path(os.path.abspath(p)) for p in outputs}:
            return common
    return changed


class StageOutputsChanged(DataError):
    """A stage's output rewritten by something else since the stage recorded it (module doc)."""


def _launched() -> bool:
    """Whether this process is one rank of several (a launcher's ``WORLD_SIZE``; `dpr.distributed` is this floor's
    neighbour, so it is read here directly)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _several_processes(one_rank: bool) -> bool:
    """True where every rank of a launch runs this stage (each writes its outputs)."""
    return not one_rank and _launched()


# What names one launch of the ranks: torchrun's run id (a fresh uuid under --standalone, which dpr-pipeline's own
# relaunch uses; the --rdzv-id given otherwise) and restart count, or Slurm's job and step.
_LAUNCH_VARS = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID", "SLURM_STEP_ID")


def _launch_id() -> str | None:
    """This launch's name, the same in every rank; None where nothing names it (torchrun's static default
    ``none`` included: every such launch has it)."""
    values = {v: os.environ.get(v, "") for v in _LAUNCH_VARS}
    if values["TORCHELASTIC_RUN_ID"] in ("", "none") and not values["SLURM_JOB_ID"]:
        return None
    return "|".join(f"{k}={v}" for k, v in values.items())


def _token(state_dir: Path, name: str, rank: int) -> Path:
    return Path(state_dir) / f".{name}.done.{rank}"


def _reads(path: Path) -> str | None:
    """The text of a small file, None where it is not there (yet)."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _read_marker(marker: Path) -> dict:
    """A stage's marker; one that is not a JSON object is a `DataError` naming it (markers are written atomically,
    so only a hand edit breaks one: deleting it runs the stage again)."""
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(marker, f"broken stage marker ({err}); delete it to run the stage again",
                        line=getattr(err, "lineno", None)) from None
    if not isinstance(recorded, dict):
        raise DataError(marker, "a stage marker is a JSON object; delete it to run the stage again")
    return recorded


@dataclass
class StageRunner:
    """Runs named stages in order, skipping those whose outputs are present and up to date. ``state_dir``'s parent
    is the run directory, whose paths count relative to it."""

    state_dir: Path
    force: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    # how long rank 0 waits for the other ranks to finish an every-rank stage before it records the stage without
    # its outputs (the ranks of a stage end together, each waiting inside it for the others' part)
    record_wait_s: float = 600.0

    def run(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        outputs: Iterable[str | Path],
        inputs: Iterable[str | Path] = (),
        params: Any = None,
        one_rank: bool = False,
    ) -> bool:
        """Run ``fn`` unless the stage is up to date. Returns True when it ran. ``one_rank``: under a launcher
        of several processes (``WORLD_SIZE`` > 1), rank 0 alone runs the stage and the other ranks wait until
        its record is written (for a stage whose writer is not safe to run twice at once over the same
        outputs, such as a model saved in place that the next stage reads)."""
        outputs, inputs = [Path(p) for p in outputs], [Path(p) for p in inputs]
        marker = Path(self.state_dir) / f"{name}.json"
        root = Path(self.state_dir).parent
        if one_rank and _launched() and int(os.environ.get("RANK", "0")) != 0:
            return self._wait_for(name, marker, outputs, params, inputs, root)
        if not self.force and marker.exists() and all(p.exists() for p in outputs) and \
                self._up_to_date(name, marker, outputs, fingerprint(params, inputs, root), params, inputs, one_rank):
            return False
        log.info("[%s] running", name)
        start = time.perf_counter()
        fn()
        seconds = time.perf_counter() - start
        missing = [str(p) for p in outputs if not p.exists()]
        if missing:
            raise RuntimeError(f"stage {name} finished without writing {missing}")
        # Outputs may be inputs of this stage too (mining rewrites train.json): fingerprint after the run.
        record = {"fingerprint": fingerprint(params, inputs, root), "seconds": seconds}
        launch = _launch_id() if _several_processes(one_rank) else None
        if not _several_processes(one_rank):
            record["outputs"] = self._output_states(outputs)
            write_json_atomic(marker, record)
        elif launch is None:  # every rank writes the same record, none knows the outputs' last state
            write_json_atomic(marker, record)
        else:
            self._record_after_every_rank(name, marker, record, outputs, launch)
        self.timings[name] = seconds
        log.info("[%s] done in %.1f s", name, seconds)
        return True

    def _record_after_every_rank(self, name: str, marker: Path, record: dict, outputs: list[Path],
                                 launch: str) -> None:
        """An every-rank stage done in this rank: its token; rank 0, once every rank's token of this launch is
        there (no rank writes the outputs any more), writes the marker with the outputs' states (module doc)."""
        rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        write_text_atomic(_token(self.state_dir, name, rank), launch)
        if rank != 0:
            return
        tokens = [_token(self.state_dir, name, r) for r in range(size)]
        deadline = time.monotonic() + self.record_wait_s
        while not all(_reads(t) == launch for t in tokens):
            if time.monotonic() > deadline:
                log.warning("[%s] not every rank finished within %.0f s: its record holds no outputs", name,
                            self.record_wait_s)
                break
            time.sleep(min(1.0, self.record_wait_s / 10))
        else:
            record["outputs"] = self._output_states(outputs)
        write_json_atomic(marker, record)
        for t in tokens:
            if _reads(t) == launch:  # a later launch's token is that launch's to read
                t.unlink(missing_ok=True)

    def _output_states(self, outputs: list[Path]) -> dict[str, str]:
        """Each output's `output_state`, keyed by its path (relative to the run directory where inside it)."""
        forms = _run_forms(Path(self.state_dir).parent)
        return {_relative(str(p), forms): output_state(p) for p in outputs}

    def _up_to_date(self, name: str, marker: Path, outputs: list[Path], want: str, params: Any,
                    inputs: list[Path], one_rank: bool) -> bool:
        """Whether the recorded stage ``name`` is current (its fingerprint ``want``); then it is logged as skipped.
        Raises `StageOutputsChanged` when it is current but an output is not what it wrote."""
        recorded = _read_marker(marker)
        if recorded.get("fingerprint") not in (want, None) and \
                recorded["fingerprint"] == fingerprint(params, inputs):  # an earlier release's marker
            recorded["fingerprint"] = want
            write_json_atomic(marker, recorded)
        if recorded.get("fingerprint") != want:
            return False
        wrote = recorded.get("outputs")
        if isinstance(wrote, dict):
            forms = _run_forms(Path(self.state_dir).parent)
            for p in outputs:
                key = _relative(str(p), forms)
                if key in wrote and wrote[key] != output_state(p):
                    place = _place(outputs, Path(self.state_dir).parent, p)
                    raise StageOutputsChanged(place, f"rewritten by something else since the pipeline's stage {name} "
                                              "wrote it; nothing was changed: remove it to run the stage again (or "
                                              "force=true to run every stage again), or give another output_dir")
        elif not _several_processes(one_rank):  # a marker from before outputs were recorded: recorded from now on
            write_json_atomic(marker, {**recorded, "outputs": self._output_states(outputs)})
        log.info("[%s] up to date, skipping (outputs: %s)", name, ", ".join(map(str, outputs)))
        self.skipped.append(name)
        self.timings.setdefault(name, recorded.get("seconds", 0.0))
        return True

    def _wait_for(self, name: str, marker: Path, outputs: list[Path], params: Any, inputs: list[Path],
                  root: Path, poll_s: float = 1.0) -> bool:
        """Another rank's run of stage ``name``: wait until its record matches this stage (a rank that fails
        ends the whole launch, so no wait outlives it). Returns False: this process did not run it."""
        log.info("[%s] rank 0 runs it; waiting", name)
        while True:
            if marker.exists() and all(p.exists() for p in outputs) and \
                    _read_marker(marker).get("fingerprint") == fingerprint(params, inputs, root):
                self.skipped.append(name)
                return False
            time.sleep(poll_s)
