"""The report's figure: one line per system, a retrieval figure against k (log-scaled k axis)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

from dpr.atomic import atomic_path


def plot_curves(
    curves: Mapping[str, Mapping[int, float]],
    path: str | Path,
    ylabel: str = "top-k accuracy",
    title: str | None = None,
    dashed: Iterable[str] = (),
) -> Path:
    """Write a PNG with ``curves[name][k]`` (fractions, shown as %) against k; returns ``path``.

    Curves named in ``dashed`` (the reader's EM) are drawn dashed in the colour of the curve before
    them whose name they start with (its system's top-k bound)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must precede pyplot
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    all_ks: set[int] = set()
    dashed, colours = set(dashed), {}
    for name, curve in curves.items():
        ks = sorted(curve)
        all_ks.update(ks)
        style = {"linestyle": "--", "marker": "s"} if name in dashed else {"marker": "o"}
        base = next((n for n in colours if name.startswith(n + " ")), None) if name in dashed else None
        if base is not None:
            style["color"] = colours[base]
        (line,) = ax.plot(ks, [100.0 * curve[k] for k in ks], markersize=3, label=name, **style)
        colours.setdefault(name, line.get_color())
    if all_ks:
        ax.set_xscale("log")
        ticks = sorted(all_ks) if len(all_ks) <= 12 else [k for k in (1, 5, 10, 20, 50, 100, 200, 500, 1000) if k in all_ks]
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(k) for k in ticks])
    ax.set_xlabel("k (passages retrieved)")
    ax.set_ylabel(f"{ylabel} (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, which="major", alpha=0.3)
    if title:
        ax.set_title(title)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path
