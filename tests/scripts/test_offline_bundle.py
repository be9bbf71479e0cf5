"""scripts/offline_bundle.sh and scripts/bundle_wheels.py: a directory holding a user's files is refused with
nothing touched, a bundle is replaced only by a bundle and only when complete, bad arguments are one line (exit 2),
the wheels archive round-trips member for member, and the size limit is kept (no network: --no-wheels and
bundle_wheels' own functions)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.scripts import script

bundle_wheels = script("bundle_wheels")
SCRIPT = REPO / "scripts" / "offline_bundle.sh"


def run(args: list[str], mirror: Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "PY": sys.executable, "DPR_DATA_MIRROR": str(mirror)})


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def one_line_refusal(proc: subprocess.CompletedProcess, words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("offline_bundle: ") and words in err, err


@pytest.mark.parametrize("target", [".", "work"])
def test_a_directory_holding_user_files_is_refused_and_left_alone(tmp_path, mirror_dir, target):
    """`offline_bundle.sh .` in a checkout used to `rm -rf` its data/, minilm/ and wheels/: now a non-empty
    directory without the bundle's marker is refused, every file kept byte for byte, nothing built beside it."""
    home = tmp_path / "checkout"
    for rel, text in {"data/registry.yaml": "datasets: []\n", "data/prepared/nq/train.json": "[]",
                      "minilm/notes.txt": "mine", "wheels/keep.whl": "w", "README.md": "# mine\n"}.items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(text)
    before = snapshot(home)
    cwd = home if target == "." else tmp_path
    proc = run([target if target == "." else str(home), "--random-weights", "--no-wheels"], mirror_dir, cwd=cwd)
    one_line_refusal(proc, "which this script did not make")
    assert snapshot(home) == before
    assert sorted(p.name for p in home.parent.iterdir()) == ["checkout"]  # no staging directory left


def test_a_bundle_is_replaced_only_by_a_bundle(tmp_path, mirror_dir):
    """A new directory is filled; a rerun replaces the bundle it made; a file the user then adds makes the next
    rerun a refusal with the bundle intact."""
    out = tmp_path / "bundle"
    first = run([str(out), "--random-weights", "--no-wheels"], mirror_dir)
    assert first.returncode == 0, first.stderr
    marker = (out / ".dpr-offline-bundle").read_text().splitlines()
    assert {"bundle.json", "minilm", "data"} <= set(marker)
    info = json.loads((out / "bundle.json").read_text())
    assert info["random_weights"] and info["mib"] <= 25 and (out / "data/squad-v1.1/dev-v1.1.json").is_file()
    assert str(out) in first.stdout and ".building." not in first.stdout
    (out / "minilm" / "stale").write_text("an old bundle's file")  # inside a part: the part is ours, replaced
    again = run([str(out), "--random-weights", "--no-wheels"], mirror_dir)
    assert again.returncode == 0, again.stderr
    assert not (out / "minilm" / "stale").exists() and (out / "minilm" / "manifest.json").is_file()
    (out / "my_notes.txt").write_text("mine")
    before = snapshot(out)
    one_line_refusal(run([str(out), "--random-weights", "--no-wheels"], mirror_dir), "holds my_notes.txt")
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_an_empty_directory_is_filled(tmp_path, mirror_dir):
    out = tmp_path / "empty"
    out.mkdir()
    proc = run([str(out), "--random-weights", "--no-wheels"], mirror_dir)
    assert proc.returncode == 0, proc.stderr
    assert (out / "bundle.json").is_file()


@pytest.mark.parametrize("args, words", [
    (["--have", "{tmp}/absent.txt"], "--have {tmp}/absent.txt: no such readable file"),
    (["--have", "{tmp}"], "--have {tmp}: no such readable file"),
    (["--have"], "--have needs a value"),
    (["--python"], "--python needs a value"),
    (["--bogus"], "unknown argument --bogus"),
])
def test_bad_arguments_are_one_line(tmp_path, mirror_dir, args, words):
    out = tmp_path / "bundle"
    proc = run([str(out), "--random-weights", "--no-wheels", *[a.format(tmp=tmp_path) for a in args]], mirror_dir)
    one_line_refusal(proc, words.format(tmp=tmp_path))
    assert not out.exists()


def test_a_file_at_the_target_or_no_target_is_one_line(tmp_path, mirror_dir):
    (tmp_path / "f").write_text("mine")
    one_line_refusal(run([str(tmp_path / "f"), "--no-wheels"], mirror_dir), "exists and is not a directory")
    assert (tmp_path / "f").read_text() == "mine"
    one_line_refusal(run([], mirror_dir), "usage:")
    one_line_refusal(run([str(tmp_path / "b"), "--no-wheels"], tmp_path / "no_mirror"), "dev-v1.1.json not found")
    one_line_refusal(run([str(tmp_path / "f" / "b"), "--no-wheels"], mirror_dir), "cannot create or write")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_rebuild_leaves_the_old_bundle_whole(tmp_path, mirror_dir, sig):
    """Killed while it builds the new bundle beside the old one: the old bundle is byte for byte what it was (SIGTERM:
    the staging directory removed too), and the next run replaces it."""
    out = tmp_path / "bundle"
    assert run([str(out), "--random-weights", "--no-wheels"], mirror_dir).returncode == 0
    before = snapshot(out)
    proc = subprocess.Popen(["bash", str(SCRIPT), str(out), "--random-weights", "--no-wheels"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PY": sys.executable, "DPR_DATA_MIRROR": str(mirror_dir)})
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".bundle.building.*/minilm")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "finished before it could be killed"
    (os.kill if sig == signal.SIGTERM else os.killpg)(proc.pid, sig)  # SIGKILL: the script and its children
    proc.wait(timeout=60)
    if sig == signal.SIGKILL:
        time.sleep(0.5)
    assert snapshot(out) == before
    if sig == signal.SIGTERM:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]
    assert run([str(out), "--random-weights", "--no-wheels"], mirror_dir).returncode == 0
    assert json.loads((out / "bundle.json").read_text())["random_weights"]


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def test_wheels_archive_round_trips_member_for_member(tmp_path):
    """pack stores each wheel's members uncompressed and xz's them together; unpack gives wheels whose members
    (names, order, bytes) are the originals', and a compressible library shrinks below its deflated wheel."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    lib = b"".join(i.to_bytes(4, "little") * 3 for i in range(200_000))  # a shared library's kind of redundancy
    files = {"pkg/__init__.py": b"x = 1\n", "pkg/lib.so": lib, "pkg-1.0.dist-info/RECORD": b"pkg/__init__.py,,\n"}
    a = _wheel(wheels / "pkg-1.0-py3-none-any.whl", files)
    _wheel(wheels / "other-2.0-py3-none-any.whl", {"other.py": b"y = 2\n"})
    size = bundle_wheels.pack(wheels, tmp_path / "wheels.tar.xz")
    assert size < a.stat().st_size
    back = bundle_wheels.unpack(tmp_path / "wheels.tar.xz", tmp_path / "out")
    assert sorted(p.name for p in back) == sorted(p.name for p in wheels.iterdir())
    with zipfile.ZipFile(tmp_path / "out" / a.name) as z:
        assert z.namelist() == list(files) and all(z.read(n) == files[n] for n in files)
        assert z.testzip() is None


def test_an_archive_from_elsewhere_is_refused(tmp_path, capsys):
    bad = tmp_path / "wheels.tar.xz"
    with tarfile.open(bad, "w:xz") as tar:
        info = tarfile.TarInfo("../escape.whl")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    assert bundle_wheels.main(["unpack", str(bad), str(tmp_path / "out")]) == 2
    assert "member '../escape.whl' is not a wheel file name" in capsys.readouterr().err
    assert not (tmp_path / "escape.whl").exists()
    bad.write_bytes(b"\xfd7zXZ\x00 truncated")
    assert bundle_wheels.main(["unpack", str(bad), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a whole xz tar of wheels" in err


def test_the_size_limit(tmp_path, capsys):
    """describe: the sum of every file against the limit; over it, exit 1 naming the largest wheels."""
    bundle = tmp_path / "b"
    (bundle / "minilm").mkdir(parents=True)
    with open(bundle / "minilm" / "w.xz", "wb") as f:
        f.truncate(40 * 2**20)  # sparse: the size is what counts
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels / "big-1.0-py3-none-any.whl", {"big.so": os.urandom(2**20)})
    bundle_wheels.pack(wheels, bundle / "wheels.tar.xz")
    args = ["describe", str(bundle), "60", "3.12", "manylinux_2_28_x86_64", "--shown-as", "/final/place"]
    assert bundle_wheels.main(args) == 0
    info = json.loads((bundle / "bundle.json").read_text())
    assert 41 <= info["mib"] < 42 and info["wheels"] == ["big-1.0-py3-none-any.whl"]
    assert set(info["parts_mib"]) == {"wheels.tar.xz", "minilm"} and info["limit_mib"] == 60
    capsys.readouterr()
    args[2] = "40"
    assert bundle_wheels.main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("offline_bundle: /final/place: 41") and "over the limit of 40 MiB" in err
    assert "big-1.0-py3-none-any.whl (1.0 MiB)" in err


def test_an_unpacked_wheel_installs_with_pip(tmp_path):
    """A wheel through pack/unpack (members stored, not deflated) is installed by pip --no-index and imports."""
    import base64
    import hashlib

    files = {"pkg_x/__init__.py": b"ANSWER = 42\n",
             "pkg_x-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: pkg-x\nVersion: 1.0\n",
             "pkg_x-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},"
                     f"{len(d)}\n" for n, d in files.items()) + "pkg_x-1.0.dist-info/RECORD,,\n"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels / "pkg_x-1.0-py3-none-any.whl", {**files, "pkg_x-1.0.dist-info/RECORD": record.encode()})
    bundle_wheels.pack(wheels, tmp_path / "wheels.tar.xz")
    (wheel,) = bundle_wheels.unpack(tmp_path / "wheels.tar.xz", tmp_path / "out")
    with zipfile.ZipFile(wheel) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
                           str(tmp_path / "site"), str(wheel)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = subprocess.run([sys.executable, "-c", "import pkg_x; print(pkg_x.ANSWER)"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, timeout=60)
    assert got.stdout.strip() == "42", got.stderr
