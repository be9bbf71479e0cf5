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
from tests.run_command import run_as_subprocess

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


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


def test_leftovers_of_outputs_never_written_again_are_swept_but_a_live_writers_temp_is_kept(tmp_path):
    """A killed writer of checkpoints/step_2 left its temp; a resumed run never writes step_2 again, so
    the next writer of that path never comes (seen: a dpr-train killed mid-save kept `.step_2.*.tmp`).
    ``clean_stale_temps_in`` sweeps what dead writers left and keeps what a live one is writing."""
    from dpr.atomic import clean_stale_temps_in

    ckpts = tmp_path / "checkpoints"
    flags = {name: tmp_path / f"inside_{name}" for name in ("step_2", "step_4")}
    procs = {name: subprocess.Popen(_py(f"""
        import time
        from pathlib import Path
        from dpr.atomic import atomic_path
        with atomic_path({str(ckpts / name)!r}) as t:
            t.mkdir(); (t / "model").write_bytes(b"x" * 1000); Path({str(flag)!r}).touch(); time.sleep(120)
        """), env=_env(), stderr=subprocess.PIPE, text=True) for name, flag in flags.items()}
    for name, flag in flags.items():
        _wait_for(flag.exists, proc=procs[name])
    _kill(procs["step_2"])                       # dead: its temp is garbage now
    unrelated = ckpts / ".keep.me"
    unrelated.write_text("not a temp")
    removed = clean_stale_temps_in(ckpts)
    assert [p.name.split(".")[1] for p in removed] == ["step_2"]
    assert [t.split(".")[1] for t in _temps(ckpts)] == ["step_4"] and unrelated.is_file()  # live writer's kept
    _kill(procs["step_4"])
    assert len(clean_stale_temps_in(ckpts)) == 1 and _temps(ckpts) == []
    assert clean_stale_temps_in(tmp_path / "absent") == []


def test_saving_a_checkpoint_sweeps_dead_writers_temps_of_other_steps(tmp_path):
    import torch

    from dpr.trainkit.checkpoint import CHECKPOINT_DIR, save_checkpoint

    stale = tmp_path / CHECKPOINT_DIR / ".step_2.999999999-abcd.tmp"  # no live process holds its lock
    (stale / "step_2").mkdir(parents=True)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    save_checkpoint(tmp_path, 4, model, opt, sched, None, {}, [], keep=1)
    assert not stale.exists() and (tmp_path / CHECKPOINT_DIR / "step_4" / "state.json").is_file()


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


# --- real SIGKILLs of the commands, then the same command again -----------------------------------------

def _run_stopped_at(target: str, when: int | str, entry: str, args: list[str], cwd: Path) -> str:
    """Run ``entry`` (a console script's ``module:function``) frozen at a call of ``target``
    (``module:function``; ``when`` as ``tests/system/stop_at_call.py`` reads it: ``[after-]N[@text]``), then SIGKILL
    it there: a kill point that cannot be missed under load. Returns the call it stopped at, as
    ``stop_at_call.py`` printed it (its arguments name the output)."""
    log = cwd / f"stopped_{os.getpid()}_{time.monotonic_ns()}.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("stop_at_call.py")), target, str(when),
                                 entry, *args], cwd=cwd, env=_env(), stdout=subprocess.DEVNULL, stderr=err)
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        proc.returncode = os.waitstatus_to_exitcode(status)
        raise AssertionError(f"exited (rc {proc.returncode}) before {when} of {target}: {log.read_text()[-3000:]}")
    _kill(proc)
    return log.read_text().rsplit("stop_at_call:", 1)[-1].splitlines()[0]  # after any progress bar's output


def _run(cmd: list[str], cwd: Path) -> None:
    """Run a command to its end: in this process (tests/run_command.py), since the reference runs and the reruns
    after a kill are about what the command leaves on disk; the runs that are killed are real processes."""
    proc = run_as_subprocess(cmd, cwd=cwd, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]


def _big_passages(path: Path, n: int = 600) -> Path:
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    with open(path, "w", encoding="utf-8") as f:
        f.write("id\ttext\ttitle\n")
        for i in range(n):
            f.write(f"x{i}\t{' '.join(words[(i * 7 + j) % 12] for j in range(40 + i % 30))} {i}\tT{i % 50}\n")
    return path


@pytest.mark.slow
def test_dpr_encode_killed_at_several_points_resumes_identically(tiny_model_dir, tmp_path):
    passages = _big_passages(tmp_path / "passages.tsv", 150)  # 3 shards of 50: two batches each
    base = [str(BIN / "dpr-encode"), f"model={tiny_model_dir}", f"passages={passages}", "num_shards=3",
            "batch_size=32", "dtype=float32", "device=cpu", "autocast=off"]
    _run(base + [f"output_dir={tmp_path / 'ref'}"], tmp_path)
    out = tmp_path / "emb"
    cmd = base + [f"output_dir={out}"]
    # frozen, then killed, just before a shard's temps are renamed into place (the run's second commit)
    def killed_before_second_commit(finished: list[int]) -> None:
        _run_stopped_at("dpr.encode:commit_shard", 2, "dpr.cli.encode:main", cmd[1:], tmp_path)
        assert sorted(p.name for p in out.glob("shard_*.json")) == [f"shard_{i:03d}_of_003.json" for i in finished]
        assert _temps(out), "the kill point is after the temps were written"

    killed_before_second_commit([0])                # mid shard 1
    first = (out / "shard_000_of_003.json").stat().st_mtime_ns
    killed_before_second_commit([0, 1])             # shard 0 kept, mid shard 2
    assert (out / "shard_000_of_003.json").stat().st_mtime_ns == first, "a finished shard was redone"
    _run(cmd, tmp_path)
    assert _temps(out) == []
    _same_tree(out, tmp_path / "ref", ignore=tuple(f"shard_{i:03d}_of_003.json" for i in range(3)))
    import numpy as np  # manifests differ only in timings

    from dpr.index.shards import list_shards
    assert [s.count for s in list_shards(out)] == [50, 50, 50]
    for a, b in zip(list_shards(out), list_shards(tmp_path / "ref")):
        assert np.array_equal(a.vectors(), b.vectors())


def test_dpr_index_killed_then_rerun_identical(tmp_path):
    import numpy as np

    from dpr.index.shards import write_shard

    x = np.random.default_rng(0).standard_normal((1000, 32)).astype(np.float32)
    for i in range(2):
        write_shard(tmp_path / "emb", i, 2, x[i * 500:(i + 1) * 500], [f"d{j}" for j in range(i * 500, (i + 1) * 500)])
    base = [str(BIN / "dpr-index"), f"embeddings={tmp_path / 'emb'}", "index=hnsw"]
    _run(base + [f"output={tmp_path / 'ref' / 'index.faiss'}"], tmp_path)
    out = tmp_path / "out"
    cmd = base + [f"output={out / 'index.faiss'}"]
    # it commits index.faiss.ids, index.faiss, index.faiss.json: killed before the first (nothing in place),
    # then in a second run before the last (the index and its ids in place, its manifest not)
    for nth, stops_at in ((1, "index.faiss.ids"), (3, "index.faiss.json")):
        assert f"{stops_at}'" in _run_stopped_at("dpr.atomic:replace_path", nth, "dpr.cli.index:main", cmd[1:], tmp_path)
        assert _temps(out)
    _run(cmd, tmp_path)
    assert _temps(tmp_path) == []
    for name in ("index.faiss", "index.faiss.ids"):
        assert filecmp.cmp(out / name, tmp_path / "ref" / name, shallow=False), name


@pytest.mark.slow
def test_dpr_bm25_mine_killed_then_rerun_identical(tmp_path):
    from tests.conftest import write_tiny_dataset

    def dataset(root: Path) -> Path:
        write_tiny_dataset(root / "tiny")
        _big_passages(root / "tiny" / "passages.tsv", 1000)
        with open(root / "tiny" / "passages.tsv", "a", encoding="utf-8") as f:
            from tests.conftest import TINY_PASSAGES
            for pid, text, title in TINY_PASSAGES:
                f.write(f"{pid}\t{text}\t{title}\n")
        return root

    def cmd(root: Path) -> list[str]:
        return [str(BIN / "dpr-bm25"), "data=squad1_open", "data.name=tiny", "data.kind=qa", f"data_dir={root}",
                "mine=true", "num_negatives=3"]

    ref, run = dataset(tmp_path / "ref"), dataset(tmp_path / "run")
    _run(cmd(ref), tmp_path)
    tiny = run / "tiny"
    # it commits (inside the index's temp dir) dpr_bm25.json, then bm25_index, train.json, dev.json,
    # bm25_mining.json: killed with the index built but not in place, then (a second run) with the index and
    # the mined train.json in place but not dev.json, then (a third, which reuses the index: its third
    # commit) before the mining manifest
    argv = cmd(run)[1:]
    for nth, stops_at in ((2, "bm25_index"), (4, "dev.json"), (3, "bm25_mining.json")):
        assert f"{stops_at}'" in _run_stopped_at("dpr.atomic:replace_path", nth, "dpr.cli.bm25:main", argv, tmp_path)
        assert _temps(run)
    _run(cmd(run), tmp_path)
    assert _temps(run) == []
    for name in ("train.json", "dev.json"):
        assert filecmp.cmp(tiny / name, ref / "tiny" / name, shallow=False), name


@pytest.mark.slow
def test_two_concurrent_dpr_bm25_mine_runs(tmp_path):
    """Before: the second crashed with "Directory not empty". Now both succeed, one after the other."""
    from tests.conftest import write_tiny_dataset

    write_tiny_dataset(tmp_path / "data" / "tiny")
    write_tiny_dataset(tmp_path / "ref" / "tiny")
    args = ["data=squad1_open", "data.name=tiny", "data.kind=qa", "mine=true", "num_negatives=3", "force=true"]
    _run([str(BIN / "dpr-bm25"), *args, f"data_dir={tmp_path / 'ref'}"], tmp_path)
    procs = [subprocess.Popen([str(BIN / "dpr-bm25"), *args, f"data_dir={tmp_path / 'data'}"], cwd=tmp_path,
                              env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    assert _temps(tmp_path) == []
    for name in ("train.json", "dev.json"):
        assert filecmp.cmp(tmp_path / "data" / "tiny" / name, tmp_path / "ref" / "tiny" / name, shallow=False)


@pytest.mark.slow
def test_dpr_data_killed_then_rerun_identical_and_no_leftovers(mirror_dir, tmp_path):
    cmd = [str(BIN / "dpr-data"), "data=nq_open_dev", f"data.mirror_dir={mirror_dir}"]
    _run(cmd + [f"data_dir={tmp_path / 'ref'}"], tmp_path)
    prep = tmp_path / "prep"
    # its files are written inside the dataset's temp dir, which is then moved into place: killed mid-way
    # (test.qa.tsv written, meta.json not), then (a second run) with the dataset complete but not in place
    for nth, stops_at in ((2, "meta.json"), (3, "nq_open_dev")):
        stop = _run_stopped_at("dpr.atomic:replace_path", nth, "dpr.cli.data:main", [*cmd[1:], f"data_dir={prep}"],
                               tmp_path)
        assert f"{stops_at}'" in stop and not (prep / "nq_open_dev").exists()
        assert _temps(prep)
    _run(cmd + [f"data_dir={prep}"], tmp_path)
    assert sorted(p.name for p in prep.iterdir()) == ["nq_open_dev"]
    _same_tree(prep / "nq_open_dev", tmp_path / "ref" / "nq_open_dev", ignore=("meta.json",))


@pytest.mark.slow
def test_dpr_train_killed_at_checkpoints_then_rerun_identical(tiny_model_dir, tiny_data_dir, tmp_path):
    """dpr-train SIGKILLed after its first and after a later checkpoint; the same command again resumes
    and ends with the weights of an uninterrupted run, and no temporary leftovers."""
    from safetensors.torch import load_file

    from dpr.trainkit import checkpoint as ckpt

    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")

    def cmd(out: Path) -> list[str]:
        return [str(BIN / "dpr-train"), "--config-dir", str(conf), "data=tiny", f"data_dir={tiny_data_dir}",
                f"output_dir={out}", "model=tiny", f"model.name={tiny_model_dir}", "train.max_steps=12",
                "train.save_every=2", "train.batch_size=3", "train.hard_negatives=1", "train.precision=fp32",
                "train.val_batch_size=8", "train.lr=1e-3", "seed=3"]

    _run(cmd(tmp_path / "ref"), tmp_path)
    out = tmp_path / "run"
    # killed just after step_2's checkpoint was moved into place, before its emptied temp dir was removed
    # (a resumed run never writes step_2 again: that leftover stayed for good until checkpoints swept them)
    _run_stopped_at("dpr.atomic:replace_path", "after-1@/step_2'", "dpr.cli.train:main", cmd(out)[1:], tmp_path)
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_2"] and _temps(out)
    # resumed from step_2, killed again just before step_8's checkpoint goes into place
    _run_stopped_at("dpr.atomic:replace_path", "1@/step_8'", "dpr.cli.train:main", cmd(out)[1:], tmp_path)
    assert ckpt.list_checkpoints(out)[-1].name == "step_6"
    _run(cmd(out), tmp_path)
    assert _temps(out) == [] and (out / "train_summary.json").is_file()
    for tower in ("question_encoder", "passage_encoder"):
        a = load_file(str(out / tower / "model.safetensors"))
        b = load_file(str(tmp_path / "ref" / tower / "model.safetensors"))
        assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a), tower


def test_threads_writing_one_path_take_turns(tmp_path):
    """The lock also serialises threads of one process (each takes the flock on its own descriptor)."""
    import threading

    out, errors = tmp_path / "out", []

    def writer(tag: str) -> None:
        try:
            for _ in range(50):
                with atomic_path(out) as t:
                    t.mkdir()
                    for j in range(4):
                        (t / str(j)).write_text(tag)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(tag,)) for tag in "AB"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len({f.read_text() for f in out.iterdir()}) == 1 and _temps(tmp_path) == []


def test_nested_writer_of_the_same_path_keeps_the_outer_temp(tmp_path):
    out = tmp_path / "out"
    with atomic_path(out) as outer:
        outer.mkdir()
        (outer / "a").write_text("outer")
        with atomic_path(out) as inner:  # a directory of the same layout (a directory never replaces a file)
            inner.mkdir()
            (inner / "a").write_text("inner")
        assert (outer / "a").read_text() == "outer"  # not removed as a "stale" temp
    assert (out / "a").read_text() == "outer"


def test_fallback_without_exchange_replaces_and_restores_on_failure(tmp_path, monkeypatch):
    """Where renameat2 cannot exchange: aside, then in; a failing second rename puts the old output back."""
    import dpr.atomic as atomic

    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    for tag in ("one", "two"):
        with atomic_path(out) as t:
            t.mkdir()
            (t / "f").write_text(tag)
    assert (out / "f").read_text() == "two"

    real_replace = os.replace

    def failing_replace(src, dst):
        if Path(dst) == out:
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        with atomic_path(out) as t:
            t.mkdir()
            (t / "f").write_text("three")
    assert (out / "f").read_text() == "two" and _temps(tmp_path) == []
