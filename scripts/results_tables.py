"""Write the result tables of README.md and docs/results/*.md from the runs' report.json files.

A table in a Markdown page is a block between two markers; the opening marker names the report and what to show:

    <!-- results-table report=docs/results/reports/squad1_open.json systems=bm25,dense,hybrid ks=1,5,20 -->
    | system | top-1 | top-5 | top-20 |
    ...
    <!-- /results-table -->

Keys: ``report`` (a path from the repository root; required), ``systems`` (comma list; default: every system in
the report's order), ``ks`` (QA reports; default: the report's ks), ``metrics`` (qrels reports; default: the
report's metrics), ``ci=true`` (the 95% interval after each figure). A report's figures are written exactly as
the evaluator computed them, so a figure cannot drift from its run.

    python scripts/results_tables.py save runs/squad1_open/eval/report.json squad1_open  # copy a run's report in
    python scripts/results_tables.py write    # rewrite every table from its report
    python scripts/results_tables.py check    # exit 1 and show the stale tables (the test suite runs this)
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping

from script_args import OneLineParser, input_file  # scripts/ is on sys.path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "docs" / "results" / "reports"
PAGES = ("README.md", "docs/results/*.md", "docs/*.md")
OPEN = re.compile(r"<!-- results-table (?P<args>[^>]*?) -->")
CLOSE = "<!-- /results-table -->"
KEYS = {"report", "systems", "ks", "metrics", "ci"}


class TableError(ValueError):
    """A marker that cannot be rendered: names the page, the line and the key."""


def parse_args(text: str, where: str) -> dict[str, str]:
    args = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or key not in KEYS:
            raise TableError(f"{where}: results-table marker: {item!r} is not one of key=value with key in {sorted(KEYS)}")
        args[key] = value
    if "report" not in args:
        raise TableError(f"{where}: results-table marker: report= is required")
    return args


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f}"


def _cell(value: float, ci: list[float] | None, show_ci: bool, scale: bool) -> str:
    fmt = _pct if scale else (lambda v: f"{v:.3f}")
    text = fmt(value)
    if show_ci and ci:
        text += f" [{fmt(ci[0])}, {fmt(ci[1])}]"
    return text


def render(report: Mapping[str, Any], args: Mapping[str, str], where: str) -> list[str]:
    """The table's lines for ``report`` as ``args`` ask (a QA report's top-k in %, a qrels report's metrics)."""
    systems = report["systems"]
    names = args["systems"].split(",") if "systems" in args else list(systems)
    missing = [n for n in names if n not in systems]
    if missing:
        raise TableError(f"{where}: systems={missing} not in {args['report']} (it has {list(systems)})")
    show_ci = args.get("ci", "false") == "true"
    if report["kind"] == "qa":
        cols = [str(k) for k in (args["ks"].split(",") if "ks" in args else report["ks"])]
        header, scale = [f"top-{k}" for k in cols], True
        get = lambda s, c: (s["top_k"].get(c), s["ci95"].get(c))  # noqa: E731
    else:
        cols = args["metrics"].split(",") if "metrics" in args else list(report["metrics"])
        header, scale = cols, False
        get = lambda s, c: (s.get(c), s["ci95"].get(c))  # noqa: E731
    lines = ["| system | " + " | ".join(header) + " |", "|---|" + "---|" * len(cols)]
    for name in names:
        cells = []
        for col in cols:
            value, ci = get(systems[name], col)
            if value is None:
                raise TableError(f"{where}: {col!r} is not in {args['report']}'s figures for {name}")
            cells.append(_cell(value, ci, show_ci, scale))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def rewrite(text: str, page: str, root: Path = ROOT) -> str:
    """``text`` with every results-table block re-rendered from its report (paths from ``root``)."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        m = OPEN.fullmatch(line.strip())
        i += 1
        if not m:
            continue
        where = f"{page}:{i}"
        args = parse_args(m["args"], where)
        end = next((j for j in range(i, len(lines)) if lines[j].strip() == CLOSE), None)
        if end is None:
            raise TableError(f"{where}: results-table marker without its closing {CLOSE}")
        path = root / args["report"]
        if not path.is_file():
            raise TableError(f"{where}: report={args['report']}: no such file")
        out += render(json.loads(path.read_text()), args, where)
        out.append(lines[end])
        i = end + 1
    return "\n".join(out)


def pages() -> list[Path]:
    return sorted({p for pattern in PAGES for p in ROOT.glob(pattern)})


def _report_name(text: str) -> str:
    """``save``'s NAME: one file name under docs/results/reports/ (no path: ``../x`` would write elsewhere)."""
    if not text or text.startswith(".") or "/" in text or "\\" in text or text.endswith(".json"):
        raise argparse.ArgumentTypeError(f"expected a report name such as squad1_open (no path, no .json), got {text!r}")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    save = sub.add_parser("save", help="copy a run's report.json into docs/results/reports/<name>.json")
    save.add_argument("report", type=input_file)
    save.add_argument("name", type=_report_name)
    sub.add_parser("write")
    sub.add_parser("check")
    args = parser.parse_args(argv)
    if args.cmd == "save":
        REPORTS.mkdir(parents=True, exist_ok=True)
        try:  # refuse a file that is not a report before copying it in
            report = json.loads(Path(args.report).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            parser.exit(2, f"results_tables: {args.report}: not JSON ({err})\n")
        if not isinstance(report, dict) or not isinstance(report.get("systems"), dict):
            parser.exit(2, f"results_tables: {args.report}: field systems: missing (not a dpr-eval report.json)\n")
        try:  # a run's report whose report.md / topk.png are another write's (a dpr-eval killed between moves)
            from dpr.output_sets import check_file_manifest

            check_file_manifest(args.report, report.get("files"), Path(args.report).parent,
                                "run dpr-eval again to write the report")
        except ValueError as err:
            parser.exit(2, f"results_tables: {err}\n")
        tmp = REPORTS / f".{args.name}.json.tmp"
        shutil.copyfile(args.report, tmp)
        tmp.replace(REPORTS / f"{args.name}.json")
        print(f"saved {args.report} as {REPORTS / (args.name + '.json')}")
        return 0
    stale = []
    for page in pages():
        rel = str(page.relative_to(ROOT))
        text = page.read_text()
        new = rewrite(text, rel)
        if new != text:
            stale.append(rel)
            if args.cmd == "write":
                tmp = page.with_name(f".{page.name}.tmp")
                tmp.write_text(new)
                tmp.replace(page)
    if args.cmd == "check" and stale:
        print("stale result tables (run `python scripts/results_tables.py write`): " + ", ".join(stale))
        return 1
    print(("rewrote: " + ", ".join(stale)) if stale and args.cmd == "write" else "result tables up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
