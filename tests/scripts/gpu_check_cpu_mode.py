"""scripts/gpu_check.sh --cpu end to end: every stage that needs no GPU passes and gpu_check.json has its interface.

The whole check takes minutes on 2 cores (a tiny pipeline twice, torchrun, the bench), so it is not a test of the
suite: .ci/run runs it once, after the suite, and fails the build on any problem listed by :func:`problems`.

    .venv/bin/python -m tests.scripts.gpu_check_cpu_mode [OUT]     # exit 0: all stages passed; 1: what is wrong

The suite keeps the fast checks of the script's parts (tests/scripts/test_gpu_check.py) and of :func:`problems`
itself (tests/scripts/test_gpu_check_cpu_mode.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 900  # about 3 min on 2 idle cores
KEYS = {"pipeline_seconds", "teacher_seconds", "report_default", "report_teacher", "train_examples_per_s",
        "encode_passages_per_s", "gpu_util"}
# what --cpu runs on a machine without a GPU: everything but the NCCL pair and the comparison with the
# committed report (the tiny job's figures have no counterpart)
STAGES = {"facts": "passed", "ddp_gloo": "passed", "ddp_nccl": "skipped", "pipeline": "passed",
          "compare_default": "skipped", "teacher": "passed", "bench": "passed"}


def _json(path: Path | str) -> dict:
    return json.loads(Path(path).read_text())


def _result_problems(out: Path) -> list[str]:
    result = _json(out / "gpu_check.json")
    missing = KEYS - set(result)
    if missing:
        return [f"gpu_check.json: keys missing: {sorted(missing)}"]
    found = []
    if not (result["pipeline_seconds"] > 0 and result["teacher_seconds"] > 0):
        found.append("pipeline_seconds and teacher_seconds must be > 0")
    for key in ("report_default", "report_teacher"):
        if not _json(result[key]).get("systems"):
            found.append(f"{key}: the report has no systems")
    if "teacher" not in _json(result["report_teacher"]).get("notes", {}):
        found.append("report_teacher: no teacher note")
    for key in ("train_examples_per_s", "encode_passages_per_s"):
        rates = result[key]
        if not (set(rates) >= {"ours", "peer"} and rates["ours"] > 0 and rates["peer"] > 0):
            found.append(f"{key}: needs ours > 0 and peer > 0, got {rates}")
    stages = {s: v["status"] for s, v in result.get("stages", {}).items()}
    if stages != STAGES:
        found.append(f"stages: {stages}, expected {STAGES}")
    return found


def problems(stdout: str, out: Path) -> list[str]:
    """Everything wrong with a finished ``gpu_check.sh --cpu`` run (its stdout, its ``OUT``): [] when it passed."""
    lines = stdout.strip().splitlines()
    found = [] if lines and lines[-1] == "gpu_check: all stages passed" else [
        f"last line: {lines[-1] if lines else '(no output)'!r}, expected 'gpu_check: all stages passed'"]
    for name, check in (("gpu_check.json", _result_problems),
                        ("ddp_gloo.json", lambda o: [] if _json(o / "ddp_gloo.json")["replicas_equal"]
                         else ["ddp_gloo.json: the replicas differ"]),
                        ("bench_gpu.md", lambda o: [] if (o / "bench_gpu.md").read_text().count("| train | ours |")
                         else ["bench_gpu.md: no '| train | ours |' row"])):
        try:
            found += check(out)
        except (OSError, ValueError, KeyError, TypeError) as err:
            found.append(f"{name}: {type(err).__name__}: {err}")
    return found


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="gpu_check_cpu.")) / "gc"
    env = {**os.environ, "PY": sys.executable, "OUT": str(out)}
    try:
        proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--cpu"], capture_output=True,
                              text=True, timeout=TIMEOUT_S, env=env, cwd=out.parent if out.parent.is_dir() else None)
    except subprocess.TimeoutExpired:
        print(f"gpu_check --cpu: not finished after {TIMEOUT_S} s (stages so far: {out / 'stages.tsv'})",
              file=sys.stderr)
        return 1
    print(proc.stdout, end="")
    found = ([f"exit status {proc.returncode}"] if proc.returncode else []) + problems(proc.stdout, out)
    if found:
        print(proc.stderr[-3000:], file=sys.stderr)
        for line in found:
            print(f"gpu_check --cpu: {line}", file=sys.stderr)
        return 1
    print(f"gpu_check --cpu: all checks passed ({out})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
