"""Faults from outside: real SIGKILLs of running commands, concurrent writers, and replacing outputs
with no moment where neither the old nor the new one exists."""

from __future__ import annotations

import filecmp
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dpr.atomic import atomic_path, clean_stale_temps, path_lock

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}


def _wait_for(pred, timeout: float = 120.0, proc: subprocess.Popen | None = None) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended (rc {proc.returncode}) before the kill point: "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > end:
            raise AssertionError("kill point never reached")
        time.sleep(0.005)


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def _temps(d: Path) -> list[str]:
    return sorted(p.name for p in d.rglob("*") if p.name.endswith(".tmp"))


def _same_tree(a: Path, b: Path, ignore: tuple[str, ...] = ()) -> None:
    fa = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.name not in ignore)
    fb = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file() and p.name not in ignore)
    assert fa == fb
    for rel in fa:
        assert filecmp.cmp(a / rel, b / rel, shallow=False), rel


# --- atomic_path: killed writers, the replacement window, concurrent writers -----------------------------

def test_killed_writer_leftovers_are_removed_by_the_next_writer(tmp_path):
    """A writer SIGKILLed inside atomic_path leaves its temp dir; the next writer of that path removes it
    (before: `.name.*.tmp` piled up, 53 MB after three kills of dpr-data nfcorpus)."""
    out = tmp_path / "out"
    flag = tmp_path / "inside"
    proc = subprocess.Popen(_py(f"""
        import time
        from pathlib import Path
        from dpr.atomic import atomic_path
        with atomic_path({str(out)!r}) as t:
            t.mkdir(); (t / "big").write_bytes(b"x" * 100000); Path({str(flag)!r}).touch(); time.sleep(60)
        """), env=_env(), stderr=subprocess.PIPE, text=True)
    _wait_for(flag.exists, proc=proc)
    _kill(proc)
    assert _temps(tmp_path) and not out.exists()
    with atomic_path(out) as t:
        t.mkdir()
        (t / "ok").write_text("1")
    assert _temps(tmp_path) == [] and (out / "ok").read_text() == "1"


def test_unrelated_temps_with_a_longer_name_are_kept(tmp_path):
    other = tmp_path / ".train.json.gz.123-abcd.tmp"
    other.mkdir()
    with atomic_path(tmp_path / "train.json") as t:
        t.write_text("[]")
    assert other.is_dir()


def test_no_moment_without_the_output_while_it_is_replaced(tmp_path):
    """A directory replaced 300 times while another process watches it: the path always exists
    (before: removed, then the new one renamed in, a window with neither). (A reader already inside
    the old directory may see it emptied as it is deleted; the name itself never goes missing.)"""
    out = tmp_path / "out"
    with atomic_path(out) as t:
        t.mkdir()
        (t / "a").write_text("0")
        (t / "b").write_text("0")
    watcher = subprocess.Popen(_py(f"""
        import os, sys
        out = {str(out)!r}; missing = 0; n = 0
        while not os.path.exists({str(tmp_path / 'done')!r}):
            n += 1
            try:
                os.listdir(out)
            except FileNotFoundError:
                missing += 1
        print(n, missing)
        """), env=_env(), stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    for i in range(300):
        with atomic_path(out) as t:
            t.mkdir()
            (t / "a").write_text(str(i))
            (t / "b").write_text(str(i))
    (tmp_path / "done").touch()
    polls, missing = map(int, watcher.communicate(timeout=60)[0].split())
    assert polls > 100 and missing == 0, (polls, missing)


def test_interrupted_fallback_replacement_restores_the_previous_output(tmp_path):
    """Where directories cannot be exchanged, the old one is moved aside first: a kill between the two
    renames is repaired by the next writer, which puts the previous output back."""
    out = tmp_path / "out"
    stale = tmp_path / ".out.4242-dead.tmp"
    (stale / ".old").mkdir(parents=True)
    (stale / ".old" / "good").write_text("previous")
    with path_lock(out):
        clean_stale_temps(out)
    assert (out / "good").read_text() == "previous" and not stale.exists()


def test_concurrent_writers_are_serialised(tmp_path):
    """Two processes replace one directory 100 times each: no crash (before: "Directory not empty"),
    and the result is wholly one writer's output."""
    out = tmp_path / "out"
    code = """
        import sys
        from dpr.atomic import atomic_path
        tag = sys.argv[1]
        for i in range(100):
            with atomic_path({out!r}) as t:
                t.mkdir()
                for j in range(5):
                    (t / str(j)).write_text(tag)
        """.format(out=str(out))
    procs = [subprocess.Popen(_py(code) + [tag], env=_env(), stderr=subprocess.PIPE, text=True) for tag in "AB"]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    contents = {f.read_text() for f in out.iterdir()}
    assert len(list(out.iterdir())) == 5 and len(contents) == 1
    assert _temps(tmp_path) == []
