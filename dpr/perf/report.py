"""The benchmarks' shared JSON interface (``--json``): rows per (system, precision), ratios, peaks, CPU flags.

    {"rows": [{"system": "ours" | <peer>, "precision": "fp32" | "bf16" | "int8", "per_s": x, "mfu": y | null}],
     "ratio": {"fp32": r, "bf16": r | null, "best": r},
     "peak_gflops": {"fp32": g, "bf16": g | null}, "cpu_flags": [...],
     "ratio_levers": {<lever>: {"precision": p, "vs_peer_default": r, "vs_peer_same_lever": r | null}}}

``ratio.<p>`` = ours / peer in precision p; ``ratio.best`` = ours with this machine's default levers /
the peer's default (fp32 unless `peer_default` says otherwise). A lever that is not a default runs as its
own system, ``ours-<lever>`` (the peer's same lever: ``<peer>-<lever>``); ``ratio_levers`` compares it with
the peer's default and with the peer's same lever in the same precision.
"""

from __future__ import annotations

from typing import Any

from dpr.perf.cpu import cpu_flags

PRECISIONS = ("fp32", "bf16", "int8")


def row(system: str, precision: str, per_s: float, mfu: float | None = None, **extra: Any) -> dict:
    """One result row; ``extra`` keys (quality checks, step times) ride along."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return {"system": system, "precision": precision, "per_s": round(float(per_s), 3),
            "mfu": None if mfu is None else round(float(mfu), 4), **extra}


def bench_report(rows: list[dict], peer: str, ours_default: str, peaks: dict[str, float | None],
                 peer_default: str = "fp32", ours_default_system: str = "ours", **extra: Any) -> dict:
    """The interface dict from ``rows``; ``ours_default`` is the precision our defaults pick on this machine,
    ``peer_default`` the peer's (fp32 unless the user runs it otherwise), ``ours_default_system`` the row system
    of our defaults (``ours``, or a lever such as ``ours-onnx`` where it is the default); ``ratio.best`` compares the two."""
    rate = {(r["system"], r["precision"]): r["per_s"] for r in rows}

    def ratio(mine: str, theirs: str, ours: str = "ours") -> float | None:
        a, b = rate.get((ours, mine)), rate.get((peer, theirs))
        return round(a / b, 3) if a and b else None

    levers = {}
    for system, p in rate:
        if system.startswith("ours-"):
            lever = system[len("ours-"):]
            same = rate.get((f"{peer}-{lever}", p))
            levers[lever] = {"precision": p, "vs_peer_default": ratio(p, peer_default, ours=system),
                             "vs_peer_same_lever": round(rate[(system, p)] / same, 3) if same else None}
    return {
        "rows": sorted(rows, key=lambda r: (PRECISIONS.index(r["precision"]), r["system"] != "ours")),
        "ratio": {"fp32": ratio("fp32", "fp32"), "bf16": ratio("bf16", "bf16"), "best": ratio(ours_default, peer_default, ours=ours_default_system)},
        "peak_gflops": {p: (None if peaks.get(p) is None else round(peaks[p], 1)) for p in ("fp32", "bf16")},
        "cpu_flags": list(cpu_flags()),
        "ours_default": ours_default if ours_default_system == "ours" else f"{ours_default_system} {ours_default}",
        **({"ratio_levers": levers} if levers else {}),
        **extra,
    }


def format_table(report: dict, columns: list[tuple[str, str, str]]) -> str:
    """The report's rows as a readable table: system, precision, then one column per (header, row key, format).

    ``mfu`` prints as a percentage; a missing or null value prints as ``-``. The last line gives the ratios and peaks.
    """
    def cell(r: dict, key: str, spec: str) -> str:
        value = r.get(key)
        if value is None:
            return "-"
        return f"{100 * value:.1f}%" if key == "mfu" else format(value, spec)

    widths = [max(len(header), 8) for header, _, _ in columns]
    lines = [f"{'system':24s} {'precision':9s} " + " ".join(f"{h:>{w}s}" for (h, _, _), w in zip(columns, widths))]
    for r in report["rows"]:
        lines.append(f"{r['system']:24s} {r['precision']:9s} "
                     + " ".join(f"{cell(r, k, s):>{w}s}" for (_, k, s), w in zip(columns, widths)))
    lines.append(f"ratios (ours / peer): {report['ratio']}; peak GFLOP/s {report['peak_gflops']}")
    if report.get("ratio_levers"):
        lines.append(f"levers (ours-<lever> / peer): {report['ratio_levers']}")
    return "\n".join(lines)
