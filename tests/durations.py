"""Which tests are ``slow``, from their measured durations rather than a hand-kept list.

``tests/durations.json`` holds each test's measured seconds (setup + call + teardown) from a full run on a 2-core
machine with nothing else running. A test that took at least :data:`SLOW_S` there is marked ``slow``, so
``pytest -m "not slow" -n 2`` stays the developer's quick loop as the suite grows; tests marked ``slow`` by hand
stay slow. Refresh the file after a full run that changed what is slow::

    pytest -q -n 2 --dist loadfile tests --store-durations

A test missing from the file (a new one) counts as quick until the next refresh.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Mapping

import pytest

DURATIONS = Path(__file__).resolve().parent / "durations.json"
SLOW_S = 2.0  # at or above this many seconds on 2 cores a test is slow


def slow_ids(durations: Mapping[str, float], threshold: float = SLOW_S) -> set[str]:
    """The node ids measured at or above ``threshold`` seconds."""
    return {node for node, seconds in durations.items() if seconds >= threshold}


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    """The recorded durations; an absent file means none recorded (every test quick), a malformed one is an error
    naming the file, not a silently quicker suite."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise pytest.UsageError(f"{path}: not valid JSON ({exc}); refresh it with --store-durations") from exc
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) for v in data.values()):
        raise pytest.UsageError(f"{path}: must map test ids to seconds; refresh it with --store-durations")
    return {str(k): float(v) for k, v in data.items()}


def write_durations(measured: Mapping[str, float], path: Path = DURATIONS) -> None:
    """Write ``measured`` (sorted, rounded to 10 ms) aside, then rename: an interrupted write leaves the old file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({k: round(v, 2) for k, v in sorted(measured.items())}, indent=0) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-durations", action="store_true",
                     help="record every test's duration in tests/durations.json (which tests are slow)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = slow_ids(read_durations())
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)


_measured: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # under xdist the workers' reports reach the controller too, so the controller alone sums every test
    _measured[report.nodeid] += report.duration


def merged(old: Mapping[str, float], measured: Mapping[str, float], root: Path) -> dict[str, float]:
    """``old`` updated with ``measured`` (a run of a few files refreshes those only), less the tests whose file is
    gone."""
    out = {**old, **measured}
    return {node: s for node, s in out.items() if (root / node.split("::", 1)[0]).is_file()}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if config.getoption("--store-durations") and not hasattr(config, "workerinput") and _measured:
        write_durations(merged(read_durations(), _measured, Path(str(config.rootpath))))
