"""Install without the source tree: a wheel in a fresh virtual environment runs the commands from
another directory (configs and the dataset registry ship inside the package)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from dpr.data.beir import write_beir_corpus, write_qrels, write_queries
from dpr.data.results import write_results

REPO = Path(__file__).resolve().parents[2]


def _sh(cmd: list, cwd: Path, env: dict, timeout: int = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd[0]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def _source_copy(dest: Path) -> Path:
    """The project's files as a fresh clone would have them (git-tracked + new, not ignored; no tests)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                            text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: cannot tell the project's files from build leftovers")
    for rel in listed.stdout.splitlines():
        src = REPO / rel
        if rel.startswith("tests/") or not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    return dest


def _fresh_venv(root: Path) -> Path:
    """A venv on the base interpreter that sees this environment's installed dependencies through a
    .pth line, but not its editable dpr: a path line in a .pth adds the directory without running the
    .pth files inside it (where the editable finder lives), and the venv's own site-packages come first."""
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(root)
    python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "_outer_env.pth").write_text("\n".join(sorted(deps)) + "\n", encoding="utf-8")
    return python


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_runs_the_commands(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update({"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    src = _source_copy(tmp_path / "src")
    _sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "dist",
         "."], cwd=src, env=env)
    wheel = next((tmp_path / "dist").glob("dpr-*.whl"))
    python = _fresh_venv(tmp_path / "venv")
    _sh([python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q", wheel],
        cwd=tmp_path, env=env)
    shutil.rmtree(src)  # nothing of the source tree is left to lean on
    bin_dir = python.parent
    work = tmp_path / "elsewhere"
    work.mkdir()

    where = _sh([python, "-c", "import dpr, dpr.resources as r; print(dpr.__file__); print(r.conf_dir())"],
                cwd=work, env=env).stdout.split()
    site = Path(where[0]).parent.parent
    assert site.is_relative_to(tmp_path / "venv") and Path(where[1]) == site / "dpr" / "conf"

    # dpr-data: a BEIR folder (no mirror, no download) through the shipped conf/data/beir.yaml
    folder = work / "mini"
    write_beir_corpus(folder / "corpus.jsonl", [{"id": f"d{i}", "title": "", "text": f"text {i}"} for i in range(6)])
    write_queries(folder / "queries.jsonl", {f"q{i}": f"query {i}" for i in range(6)})
    write_qrels(folder / "qrels" / "train.tsv", {f"q{i}": {f"d{i}": 1} for i in range(4)})
    write_qrels(folder / "qrels" / "test.tsv", {f"q{i}": {f"d{i}": 1} for i in range(4, 6)})
    _sh([bin_dir / "dpr-data", "data=beir", "data.path=mini", "data_dir=prepared"], cwd=work, env=env)
    assert (work / "prepared" / "mini" / "qrels" / "dev.tsv").is_file()

    job = _sh([bin_dir / "dpr-train", "--cfg", "job", "--resolve", "data=beir", "data.path=mini", "data_dir=prepared"],
              cwd=work, env=env).stdout
    assert "batch_size:" in job and "name: mini" in job and "recipe: beir" in job
    helptext = _sh([bin_dir / "dpr-train", "--help"], cwd=work, env=env).stdout
    groups = helptext.split("== Config groups ==", 1)[-1]
    for group in ("model:", "data:", "train:", "logger:"):
        assert group in groups, helptext
    assert "beir" in groups and "minilm" in groups

    ctx = [{"id": "d1", "title": "", "text": "the answer", "score": 1.0, "has_answer": True}]
    write_results(work / "a.json", [{"question": "q", "answers": ["answer"], "ctxs": ctx}])
    write_results(work / "b.json", [{"question": "q", "answers": ["answer"], "ctxs": ctx}])
    _sh([bin_dir / "dpr-eval", "results=[a.json,b.json]", "output_dir=eval", "resamples=10"], cwd=work, env=env)
    assert (work / "eval" / "report.json").is_file() and (work / "eval" / "topk.png").is_file()
    for script in ("dpr-export", "dpr-retrieve", "dpr-bm25", "dpr-pipeline"):
        assert (bin_dir / script).is_file(), script
