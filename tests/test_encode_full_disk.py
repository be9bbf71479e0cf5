"""`dpr-encode` on a full disk: the memory-mapped shard's space is reserved before the first write, so a full disk
is one line naming the shard (not SIGBUS, exit 135), and the same command resumes once there is space."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

from dpr import encode
from dpr.index.shards import list_shards
from tests.encode_kw import encode_corpus
from tests.run_command import run_command

KW = dict(dtype="float32", batch_size=8, device="cpu", autocast="off", progress=False)


def _no_space(fd, offset, length):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_no_space_is_one_line_and_the_run_resumes(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    psg, out = tiny_data_dir / "tiny" / "passages.tsv", tmp_path / "emb"
    encode_corpus(tiny_model_dir, psg, tmp_path / "ref", num_shards=2, **KW)
    real = os.posix_fallocate
    calls = []

    def second_fails(fd, offset, length):  # shard 0 fits, the disk is full at shard 1
        calls.append(length)
        return real(fd, offset, length) if len(calls) == 1 else _no_space(fd, offset, length)

    monkeypatch.setattr(encode.os, "posix_fallocate", second_fails)
    with pytest.raises(OSError, match=r"no space left on the device for shard 1's vectors .*finished shards are kept"):
        encode_corpus(tiny_model_dir, psg, out, num_shards=2, **KW)
    assert (out / "shard_000_of_002.json").is_file() and not (out / "shard_001_of_002.json").exists()
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.setattr(encode.os, "posix_fallocate", real)
    encode_corpus(tiny_model_dir, psg, out, num_shards=2, **KW)
    for a, b in zip(list_shards(out), list_shards(tmp_path / "ref")):
        assert np.array_equal(a.vectors(), b.vectors()) and a.ids() == b.ids()


def test_a_file_system_without_fallocate_gets_zeros_written_through_the_file(tmp_path, monkeypatch):
    path = tmp_path / "v.npy"
    vectors = np.lib.format.open_memmap(path, mode="w+", dtype="float32", shape=(3000, 64))

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(encode.os, "posix_fallocate", unsupported)
    assert os.stat(path).st_blocks * 512 < path.stat().st_size  # sparse: the blocks are not there yet
    encode.reserve_space(path, 0, vectors.offset)
    assert os.stat(path).st_blocks * 512 >= path.stat().st_size - vectors.offset
    vectors[:] = 1.0
    vectors.flush()
    del vectors
    assert np.load(path).shape == (3000, 64) and float(np.load(path).min()) == 1.0  # the header was kept


@pytest.fixture()
def tiny_tmpfs(tmp_path):
    """A 128 KiB tmpfs (needs root and mount rights; skipped where there are none)."""
    mnt = tmp_path / f"full-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mnt)],
                                                        capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_dpr_encode_on_a_really_full_disk_is_one_line(tiny_model_dir, tmp_path, tiny_tmpfs):
    psg = tmp_path / "passages.tsv"
    psg.write_text("id\ttext\ttitle\n" + "".join(f"p{i}\tpassage number {i}\tT\n" for i in range(6000)))
    proc = run_command(["dpr-encode", f"model={tiny_model_dir}", f"passages={psg}", f"output_dir={tiny_tmpfs / 'emb'}",
                        "dtype=float32", "autocast=off", "device=cpu", "num_shards=1"], cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("dpr-encode")]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
    assert "no space left on the device for shard 0's vectors" in lines[0]
