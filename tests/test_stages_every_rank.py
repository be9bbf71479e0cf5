"""A stage every rank of a launch runs records what it wrote once every rank is done (`dpr.stages`): each rank writes
the outputs, so rank 0 waits for the others' tokens before it records their state. A rewrite by something else is
then refused under the launch as in one process, and a launch the environment does not name records no outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from dpr.stages import StageRunner, output_state

WORKER = Path(__file__).resolve().parent / "stage_rank_worker.py"


def _launch(run: Path, delays: tuple[float, float], run_id: str | None, wait: float = 60.0) -> list[dict]:
    """The two ranks of one launch, as real processes; what each printed."""
    procs = []
    for rank, delay in enumerate(delays):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "SLURM_"))}
        env.update(WORLD_SIZE="2", RANK=str(rank), **({"TORCHELASTIC_RUN_ID": run_id} if run_id else {}))
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(run), str(delay), str(wait)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _marker(run: Path) -> dict:
    return json.loads((run / "stages" / "every.json").read_text())


def test_rank_0_records_the_outputs_as_the_last_rank_left_them(tmp_path):
    run = tmp_path / "run"
    # rank 1 writes the output a second after rank 0: its copy is the one left
    assert _launch(run, (0.0, 1.0), uuid.uuid4().hex) == [{"ran": True}, {"ran": True}]
    assert _marker(run)["outputs"] == {"<run>/out.txt": output_state(run / "out.txt")}
    assert sorted(p.name for p in (run / "stages").iterdir()) == ["every.json"]  # the tokens are gone
    assert _launch(run, (0.0, 0.0), uuid.uuid4().hex) == [{"ran": False}, {"ran": False}]  # up to date
    later = (run / "out.txt").stat().st_mtime_ns + 2_000_000_000
    os.utime(run / "out.txt", ns=(later, later))  # rewritten by something else
    results = _launch(run, (0.0, 0.0), uuid.uuid4().hex)
    assert all("rewritten by something else" in r.get("refused", "") for r in results), results


def test_a_launch_nothing_names_records_no_outputs(tmp_path):
    """torchrun's static default run id ``none`` is every such launch's: an earlier launch's token would pass."""
    run = tmp_path / "run"
    assert _launch(run, (1.0, 1.5), "none")[0] == {"ran": True}  # (rank 1 may start after rank 0's record: skips)
    assert "outputs" not in _marker(run)
    assert sorted(os.listdir(run / "stages")) == ["every.json"], os.listdir(run / "stages")


def test_an_earlier_launchs_token_is_not_taken_for_a_rank_done(tmp_path, monkeypatch):
    """Rank 1's token left by a killed launch: rank 0 waits its time for this launch's, then records no outputs
    (the earlier token is left alone)."""
    stages = tmp_path / "run" / "stages"
    stages.mkdir(parents=True)
    stale = stages / ".every.done.1"
    stale.write_text("TORCHELASTIC_RUN_ID=killed|TORCHELASTIC_RESTART_COUNT=|SLURM_JOB_ID=|SLURM_STEP_ID=")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "this-launch")
    out = tmp_path / "run" / "out.txt"
    assert StageRunner(stages, record_wait_s=0.5).run("every", lambda: out.write_text("x"), outputs=[out]) is True
    assert "outputs" not in json.loads((stages / "every.json").read_text())
    assert sorted(os.listdir(stages)) == [".every.done.1", "every.json"] and "killed" in stale.read_text()
