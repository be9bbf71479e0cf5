"""The CPU run of scripts/gpu_check.sh is checked once after the suite (.ci/run): its checker passes a good run and
names each thing wrong with a bad one, and .ci/run runs it after the README's test command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.scripts.gpu_check_cpu_mode import STAGES, problems

PASSED = "gpu_check: facts passed in 1.0s\ngpu_check: all stages passed\n"


def _good_run(out: Path) -> Path:
    """What a passing ``gpu_check.sh --cpu`` leaves in OUT."""
    out.mkdir()
    for name, notes in (("report_default.json", {}), ("report_teacher.json", {"teacher": "k=5"})):
        (out / name).write_text(json.dumps({"systems": {"bm25": {}}, "notes": notes}))
    (out / "gpu_check.json").write_text(json.dumps({
        "pipeline_seconds": 10.0, "teacher_seconds": 5.0, "report_default": str(out / "report_default.json"),
        "report_teacher": str(out / "report_teacher.json"), "train_examples_per_s": {"ours": 3.0, "peer": 2.0},
        "encode_passages_per_s": {"ours": 30.0, "peer": 20.0}, "gpu_util": {},
        "stages": {s: {"status": v} for s, v in STAGES.items()}}))
    (out / "ddp_gloo.json").write_text(json.dumps({"replicas_equal": True}))
    (out / "bench_gpu.md").write_text("| stage | system |\n| train | ours | 3.0 |\n")
    return out


def test_a_good_run_has_no_problems(tmp_path):
    assert problems(PASSED, _good_run(tmp_path / "gc")) == []


def _edit(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _drop(path: Path, key: str) -> None:
    data = json.loads(path.read_text())
    del data[key]
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("spoil, words", [
    (lambda o: None, "last line"),  # stdout without the closing line (below)
    (lambda o: _edit(o / "gpu_check.json", teacher_seconds=0), "teacher_seconds"),
    (lambda o: _edit(o / "gpu_check.json", encode_passages_per_s={"ours": 1.0}), "encode_passages_per_s"),
    (lambda o: _edit(o / "gpu_check.json", stages={"facts": {"status": "passed"}}), "stages:"),
    (lambda o: _edit(o / "report_teacher.json", notes={}), "no teacher note"),
    (lambda o: _edit(o / "report_default.json", systems={}), "report_default: the report has no systems"),
    (lambda o: _edit(o / "ddp_gloo.json", replicas_equal=False), "replicas differ"),
    (lambda o: (o / "bench_gpu.md").write_text("| eval |\n"), "bench_gpu.md"),
    (lambda o: (o / "gpu_check.json").unlink(), "gpu_check.json: FileNotFoundError"),
    (lambda o: _drop(o / "gpu_check.json", "gpu_util"), "keys missing: ['gpu_util']"),
], ids=["last-line", "seconds", "rates", "stages", "teacher-note", "systems", "ddp", "bench", "no-json", "keys"])
def test_each_problem_is_named(tmp_path, spoil, words):
    out = _good_run(tmp_path / "gc")
    spoil(out)
    found = problems("gpu_check: facts passed\n" if words == "last line" else PASSED, out)
    assert found and any(words in line for line in found), found


def test_ci_runs_the_cpu_check_once_after_the_suite():
    lines = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    suite = lines.index("DPR_DATA_MIRROR=../shared/data .venv/bin/python -m pytest -q -n 2 --dist loadfile tests")
    check = [i for i, ln in enumerate(lines) if "tests.scripts.gpu_check_cpu_mode" in ln and not ln.startswith("#")]
    assert len(check) == 1 and check[0] > suite, check
