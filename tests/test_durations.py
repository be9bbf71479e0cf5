"""The slow marker comes from measured durations (tests/durations.py): thresholds, merging, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import durations


def test_a_test_at_or_over_the_threshold_is_slow_and_one_under_is_not() -> None:
    measured = {"a.py::t1": 1.99, "a.py::t2": 2.0, "b.py::t3": 40.0}
    assert durations.slow_ids(measured) == {"a.py::t2", "b.py::t3"}
    assert durations.slow_ids(measured, threshold=50) == set()


def test_a_partial_run_refreshes_its_own_tests_and_drops_those_of_deleted_files(tmp_path: Path) -> None:
    (tmp_path / "kept.py").write_text("")
    old = {"kept.py::a": 5.0, "kept.py::b": 0.1, "gone.py::c": 9.0}
    assert durations.merged(old, {"kept.py::b": 3.0}, tmp_path) == {"kept.py::a": 5.0, "kept.py::b": 3.0}


def test_the_file_round_trips_and_an_absent_file_means_every_test_quick(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    assert durations.read_durations(path) == {}
    durations.write_durations({"x.py::t": 2.345678, "a.py::u": 1}, path)
    assert durations.read_durations(path) == {"a.py::u": 1.0, "x.py::t": 2.35}
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", json.dumps({"x.py::t": "slow"})])
def test_a_malformed_file_is_an_error_naming_it(tmp_path: Path, text: str) -> None:
    path = tmp_path / "durations.json"
    path.write_text(text)
    with pytest.raises(pytest.UsageError, match="durations.json"):
        durations.read_durations(path)


def test_the_committed_file_marks_its_slow_tests_at_collection(pytestconfig: pytest.Config) -> None:
    recorded = durations.read_durations()
    assert recorded, "tests/durations.json is missing or empty: refresh it with --store-durations"
    slow = durations.slow_ids(recorded)
    assert slow and len(slow) < len(recorded)  # a threshold that splits the suite, not all or nothing
