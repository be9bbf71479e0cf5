"""Check that a run reproduces a recipe's published figures: every system's figures within a tolerance.

CI (`.ci/run`) runs the README's main command on the fresh clone after the test suite and then

    python scripts/check_reproduction.py runs/squad1_open/eval/report.json docs/results/reports/squad1_open.json

which compares each system of the published report (``docs/results/reports/<recipe>.json``, the figures the README
and docs/results/ show) with the run's: a QA report's top-k accuracy at top-1/5/20/100 (``--ks``), a qrels
report's metrics (nDCG, MRR, recall: every one the published report lists, or ``--metrics``). A figure that moved
by more than ``--tolerance`` points (default 1.0; the figures agree to 0.1 point across the CPU kinds measured,
and one squad1_open question is 0.05 point), or a system or figure the run lacks, fails (exit 1) with a table of
what moved. Figures that moved within the tolerance are shown too, so a drift is seen before it fails. Exit 0:
reproduced; exit 2: a report that cannot be read (one line naming the file and the field), or a selection that
compares nothing (``--ks ,``). The recipes guarded this way: docs/results/reproduction.md.
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
DEFAULT_TOLERANCE = 1.0  # points (%) of top-k accuracy or of a qrels metric


class ReportError(ValueError):
    """A report that cannot be compared: names the file and the field."""


@dataclass(frozen=True)
class Row:
    system: str
    k: int | str            # a QA report's top-k, or a qrels report's metric (e.g. "ndcg@10")
    expected: float         # % (published)
    got: float | None       # % (this run); None: the run lacks it

    @property
    def figure(self) -> str:
        return f"top-{self.k}" if isinstance(self.k, int) else self.k

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
        lines = ["| system | figure | published | this run | change | |", "|---|---|---|---|---|---|"]
        for r in self.moved():
            got = "missing" if r.got is None else f"{r.got:.1f}"
            change = "" if r.delta is None else f"{r.delta:+.2f}"
            mark = f"FAIL (> {self.tolerance:g})" if r in bad else "ok"
            lines.append(f"| {r.system} | {r.figure} | {r.expected:.1f} | {got} | {change} | {mark} |")
        return "\n".join(lines)

    def summary(self) -> str:
        systems = len({r.system for r in self.rows})
        if self.ok:
            largest = max((abs(r.delta) for r in self.rows), default=0.0)
            return (f"reproduced: {len(self.rows)} figures of {systems} systems within ±{self.tolerance:g} point "
                    f"(largest change {largest:.2f})")
        return (f"NOT reproduced: {len(self.failed())} of {len(self.rows)} figures of {systems} systems moved by more "
                f"than {self.tolerance:g} point or are missing")


def _percent(value: Any, where: str, field: str, noun: str) -> float:
    """A report's fraction in [0, 1] as %, or a one-line ReportError naming the file and the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= 1:
        raise ReportError(f"{where}: field {field}: {value!r} is no {noun} in [0, 1]")
    return 100.0 * float(value)


def _systems(report: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    systems = report.get("systems") if isinstance(report, Mapping) else None
    if not isinstance(systems, Mapping) or not systems:
        raise ReportError(f"{where}: field systems: missing or empty (not a dpr-eval report.json?)")
    for name, entry in systems.items():
        if not isinstance(entry, Mapping):
            raise ReportError(f"{where}: field systems.{name}: not an object")
    return systems


def _top_k(report: Mapping[str, Any], where: str) -> dict[str, dict[int, float]]:
    """``{system: {k: accuracy in %}}`` of a QA report (`dpr.eval.report.evaluate_qa`'s report.json)."""
    out: dict[str, dict[int, float]] = {}
    for name, entry in _systems(report, where).items():
        top_k = entry.get("top_k")
        if not isinstance(top_k, Mapping):
            raise ReportError(f"{where}: field systems.{name}.top_k: missing (a QA report has top-k accuracy)")
        figures: dict[int, float] = {}
        for k, v in top_k.items():
            value = _percent(v, where, f"systems.{name}.top_k.{k}", "accuracy")
            try:
                figures[int(k)] = value
            except ValueError:
                raise ReportError(f"{where}: field systems.{name}.top_k.{k}: not a whole number k") from None
        out[str(name)] = figures
    return out


def _qrels_metrics(report: Mapping[str, Any], where: str) -> dict[str, dict[str, float]]:
    """``{system: {metric: value in %}}`` of a qrels report (`dpr.eval.report.evaluate_qrels`: its ``metrics``
    list, each system's value of each); a metric a system lacks is left out (a failed row when published)."""
    metrics = report.get("metrics")
    if not isinstance(metrics, list) or not metrics or not all(isinstance(m, str) and m for m in metrics):
        raise ReportError(f"{where}: field metrics: missing or not a list of metric names (a qrels report lists them)")
    return {str(name): {m: _percent(entry[m], where, f"systems.{name}.{m}", "metric value") for m in metrics
                        if m in entry} for name, entry in _systems(report, where).items()}


def _figures(report: Mapping[str, Any], where: str) -> tuple[str, dict[str, dict]]:
    kind = report.get("kind", "qa") if isinstance(report, Mapping) else "qa"
    if kind == "qrels":
        return kind, _qrels_metrics(report, where)
    return "qa", _top_k(report, where)


def compare_reports(got: Mapping[str, Any], expected: Mapping[str, Any], *, ks: Sequence[int] = DEFAULT_KS,
                    tolerance: float = DEFAULT_TOLERANCE, systems: Sequence[str] | None = None,
                    metrics: Sequence[str] | None = None,
                    where: tuple[str, str] = ("run", "published")) -> Comparison:
    """Compare a run's report with the published one: every system of the published report (or ``systems``) at
    each k of ``ks`` (a QA report) or each metric (a qrels report: ``metrics``, default every one it lists). A
    system or figure the run lacks is a failed row; systems only the run has are not compared (a recipe may add
    one before its figures are published). An empty selection compares nothing and is refused."""
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite number >= 0 (points), got {tolerance!r}")
    kind, pub = _figures(expected, where[1])
    run_kind, run = _figures(got, where[0])
    if run_kind != kind:
        raise ReportError(f"{where[0]}: field kind: {run_kind!r}, but the published report is {kind!r}")
    names = list(systems) if systems is not None else list(pub)
    keys: list = list(ks) if kind == "qa" else (list(metrics) if metrics is not None else
                                                list(dict.fromkeys(m for f in pub.values() for m in f)))
    if not names or not keys:
        raise ValueError(f"nothing to compare: {'no system' if not names else 'no k' if kind == 'qa' else 'no metric'} "
                         "selected (a check of 0 figures proves nothing)")
    comparison = Comparison(float(tolerance))
    field = "top_k." if kind == "qa" else ""
    for name in names:
        if name not in pub:
            raise ReportError(f"{where[1]}: field systems.{name}: not in the published report")
        for key in keys:
            if key not in pub[name]:
                raise ReportError(f"{where[1]}: field systems.{name}.{field}{key}: not in the published report")
            comparison.rows.append(Row(name, int(key) if kind == "qa" else key, pub[name][key],
                                       run.get(name, {}).get(key)))
    return comparison


def read_report(path: str | Path, whole_set: bool = False) -> dict:
    """The report at ``path``; ``whole_set``: a run's report, whose report.md and topk.png must be the ones it was
    written with (its ``files``: a dpr-eval killed between its moves is refused, not compared). A published copy
    in docs/results/reports stands alone."""
    path = Path(path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file (did the run finish?)") from None
    except IsADirectoryError:
        raise ReportError(f"{path}: is a directory; give its report.json (e.g. {path / 'report.json'})") from None
    except OSError as err:
        raise ReportError(f"{path}: cannot be read ({err.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ReportError(f"{path}: not JSON ({err})") from None
    if whole_set and isinstance(report, dict):
        from dpr.output_sets import check_file_manifest  # a DataError is a ValueError: one line, exit 2

        check_file_manifest(path, report.get("files"), path.parent, "run dpr-eval again to write the report")
    return report


def _ks(text: str) -> list[int]:
    """``--ks 1,5,20``: whole numbers >= 1, at least one (argparse turns the error into one line)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected a comma list of whole numbers >= 1 (e.g. 1,5,20,100), got {text!r}")
    return [int(p) for p in parts]


def _names(text: str) -> list[str]:
    """``--systems a,b`` / ``--metrics m``: at least one name."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected a comma list of at least one name, got {text!r}")
    return parts


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints the usage too: one line is the scripts' rule
        self.exit(2, f"{self.prog}: {message} (--help for usage)\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = _OneLineParser(prog="check_reproduction", description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="the run's report.json, e.g. runs/squad1_open/eval/report.json")
    ap.add_argument("expected", help="the published report, e.g. docs/results/reports/squad1_open.json")
    ap.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                    help=f"points a figure may move (default {DEFAULT_TOLERANCE:g})")
    ap.add_argument("--ks", type=_ks, default=list(DEFAULT_KS),
                    help="the k compared in a QA report (default 1,5,20,100)")
    ap.add_argument("--metrics", type=_names, default=None,
                    help="the metrics compared in a qrels report (default: every one the published report lists)")
    ap.add_argument("--systems", type=_names, default=None,
                    help="comma list (default: every system of the published report)")
    args = ap.parse_args(argv)
    try:
        comparison = compare_reports(read_report(args.report, whole_set=True), read_report(args.expected), ks=args.ks,
                                     tolerance=args.tolerance, systems=args.systems, metrics=args.metrics,
                                     where=(args.report, args.expected))
    except ValueError as err:  # ReportError included: one line, exit 2
        print(f"check_reproduction: {err}", file=sys.stderr)
        return 2
    if comparison.moved():
        print(comparison.table())
    print(f"{args.report} vs {args.expected}: {comparison.summary()}")
    return 0 if comparison.ok else 1


if __name__ == "__main__":
    sys.exit(main())
