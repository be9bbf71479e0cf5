"""Check that a run reproduces a recipe's published figures: every system's top-k accuracy within a tolerance.

CI (`.ci/run`) runs the README's main command on the fresh clone after the test suite and then

    python scripts/check_reproduction.py runs/squad1_open/eval/report.json docs/results/reports/squad1_open.json

which compares each system of the published report (``docs/results/reports/<recipe>.json``, the figures the README
and docs/results/ show) with the run's at top-1/5/20/100: a figure that moved by more than ``--tolerance`` points
(default 1.0; the figures agree to 0.1 point across the CPU kinds measured, and one squad1_open question is 0.05
point), or a system or k the run lacks, fails (exit 1) with a table of what moved. Figures that moved within the
tolerance are shown too, so a drift is seen before it fails. Exit 0: reproduced; exit 2: a report that cannot be
read (one line naming the file and the field). The recipes guarded this way: docs/results/reproduction.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

DEFAULT_KS = (1, 5, 20, 100)
DEFAULT_TOLERANCE = 1.0  # points of top-k accuracy (%)


class ReportError(ValueError):
    """A report that cannot be compared: names the file and the field."""


@dataclass(frozen=True)
class Row:
    system: str
    k: int
    expected: float         # % (published)
    got: float | None       # % (this run); None: the run lacks it

    @property
    def delta(self) -> float | None:
        return None if self.got is None else self.got - self.expected


@dataclass
class Comparison:
    tolerance: float
    rows: list[Row] = field(default_factory=list)

    def failed(self) -> list[Row]:
        """Rows out of tolerance, or missing from the run."""
        return [r for r in self.rows if r.delta is None or abs(r.delta) > self.tolerance + 1e-9]

    def moved(self) -> list[Row]:
        """Rows that differ at all (to 0.01 point), missing ones included."""
        return [r for r in self.rows if r.delta is None or abs(r.delta) >= 0.005]

    @property
    def ok(self) -> bool:
        return not self.failed()

    def table(self) -> str:
        """A Markdown table of what moved: system, k, published, this run, change, and whether it is out of bounds."""
        bad = set(self.failed())
        lines = ["| system | k | published | this run | change | |", "|---|---|---|---|---|---|"]
        for r in self.moved():
            got = "missing" if r.got is None else f"{r.got:.1f}"
            change = "" if r.delta is None else f"{r.delta:+.2f}"
            mark = f"FAIL (> {self.tolerance:g})" if r in bad else "ok"
            lines.append(f"| {r.system} | top-{r.k} | {r.expected:.1f} | {got} | {change} | {mark} |")
        return "\n".join(lines)

    def summary(self) -> str:
        systems = len({r.system for r in self.rows})
        if self.ok:
            largest = max((abs(r.delta) for r in self.rows), default=0.0)
            return (f"reproduced: {len(self.rows)} figures of {systems} systems within ±{self.tolerance:g} point "
                    f"(largest change {largest:.2f})")
        return (f"NOT reproduced: {len(self.failed())} of {len(self.rows)} figures of {systems} systems moved by more "
                f"than {self.tolerance:g} point or are missing")


def _top_k(report: Mapping[str, Any], where: str) -> dict[str, dict[int, float]]:
    """``{system: {k: accuracy in %}}`` of a QA report (`dpr.eval.report.evaluate_qa`'s report.json)."""
    systems = report.get("systems") if isinstance(report, Mapping) else None
    if not isinstance(systems, Mapping) or not systems:
        raise ReportError(f"{where}: field systems: missing or empty (not a dpr-eval report.json?)")
    out: dict[str, dict[int, float]] = {}
    for name, entry in systems.items():
        top_k = entry.get("top_k") if isinstance(entry, Mapping) else None
        if not isinstance(top_k, Mapping):
            raise ReportError(f"{where}: field systems.{name}.top_k: missing (a QA report has top-k accuracy)")
        figures: dict[int, float] = {}
        for k, v in top_k.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 1:
                raise ReportError(f"{where}: field systems.{name}.top_k.{k}: {v!r} is no accuracy in [0, 1]")
            try:
                figures[int(k)] = 100.0 * float(v)
            except ValueError:
                raise ReportError(f"{where}: field systems.{name}.top_k.{k}: not a whole number k") from None
        out[str(name)] = figures
    return out


def compare_reports(got: Mapping[str, Any], expected: Mapping[str, Any], *, ks: Sequence[int] = DEFAULT_KS,
                    tolerance: float = DEFAULT_TOLERANCE, systems: Sequence[str] | None = None,
                    where: tuple[str, str] = ("run", "published")) -> Comparison:
    """Compare a run's report with the published one: every system of the published report (or ``systems``) at
    each k of ``ks`` it has. A system or k the run lacks is a failed row; systems only the run has are not
    compared (a recipe may add one before its figures are published)."""
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite number >= 0 (points), got {tolerance!r}")
    run, pub = _top_k(got, where[0]), _top_k(expected, where[1])
    names = list(systems) if systems is not None else list(pub)
    comparison = Comparison(float(tolerance))
    for name in names:
        if name not in pub:
            raise ReportError(f"{where[1]}: field systems.{name}: not in the published report")
        for k in ks:
            if k not in pub[name]:
                raise ReportError(f"{where[1]}: field systems.{name}.top_k.{k}: not in the published report")
            comparison.rows.append(Row(name, int(k), pub[name][k], run.get(name, {}).get(k)))
    return comparison


def read_report(path: str | Path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file (did the run finish?)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ReportError(f"{path}: not JSON ({err})") from None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="the run's report.json, e.g. runs/squad1_open/eval/report.json")
    ap.add_argument("expected", help="the published report, e.g. docs/results/reports/squad1_open.json")
    ap.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                    help=f"points of top-k accuracy a figure may move (default {DEFAULT_TOLERANCE:g})")
    ap.add_argument("--ks", default=",".join(map(str, DEFAULT_KS)), help="the k compared (default 1,5,20,100)")
    ap.add_argument("--systems", default=None, help="comma list (default: every system of the published report)")
    args = ap.parse_args(argv)
    try:
        ks = [int(k) for k in args.ks.split(",") if k.strip()]
        systems = [s for s in args.systems.split(",") if s] if args.systems else None
        comparison = compare_reports(read_report(args.report), read_report(args.expected), ks=ks,
                                     tolerance=args.tolerance, systems=systems, where=(args.report, args.expected))
    except ValueError as err:  # ReportError included: one line, exit 2
        print(f"check_reproduction: {err}", file=sys.stderr)
        return 2
    if comparison.moved():
        print(comparison.table())
    print(f"{args.report} vs {args.expected}: {comparison.summary()}")
    return 0 if comparison.ok else 1


if __name__ == "__main__":
    sys.exit(main())
