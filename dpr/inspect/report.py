"""``inspect.json`` (every figure), ``inspect.md`` (the same for people, warnings first) and
``inspect.png`` (token lengths against the max lengths; the teacher's margin histogram)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from dpr.atomic import atomic_path, write_json_atomic, write_text_atomic

RAW = ("lengths", "margins")  # per-item lists: plotted, not stored


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in RAW}
    return obj


def markdown(report: Mapping[str, Any]) -> str:
    c, sp, fn = report["counts"], report["shared_positives"], report["false_negatives"]
    lines = [f"# Dataset inspection: {report['dataset']}", "",
             f"kind `{report['kind']}`, tokenizer of `{report['model']}`, batch size {sp['batch_size']}", ""]
    lines += [f"- {w}" for w in report["warnings"]] or ["No warnings."]
    lines += ["", "| figure | value |", "|---|---|",
              f"| passages | {c['passages']} |",
              f"| questions (train / dev) | {c['questions']['train']} / {c['questions']['dev']} |",
              f"| positives per question | {c['positives_per_question']:.2f} |",
              f"| hard negatives per question | {c['hard_negatives_per_question']:.2f} |",
              f"| questions without positives | {c['questions_without_positives']} |",
              f"| questions without negatives | {c['questions_without_negatives']} |",
              f"| questions sharing their positive | {sp['questions_sharing_a_positive']} "
              f"({sp['positives_shared']} passages, {sp['same_positive_pairs']} pairs) |",
              f"| same-positive pairs in a random batch of {sp['batch_size']} (in-batch false negatives unless "
              f"train.dedup_positives keeps them apart) | {sp['expected_colliding_pairs_per_batch']:.3f} |",
              f"| mined negatives | {fn['mined_negatives']} |",
              f"| … judged relevant / containing the answer | {fn['judged_relevant']} / {fn['contain_answer']} "
              f"({100 * fn['false_negative_rate']:.2f}%) |"]
    for key, what in (("question_tokens", "question"), ("passage_tokens", "passage")):
        t = report[key]
        lines.append(f"| {what} tokens: mean / p50 / p95 / max (max length {t['max_length']}) | "
                     f"{t['mean']:.1f} / {t['p50']:.0f} / {t['p95']:.0f} / {t['max']} |")
        lines.append(f"| {what}s truncated | {t['truncated']} of {t['count']} ({100 * t['share_truncated']:.1f}%) |")
    te = report.get("teacher")
    if te:
        lines += [f"| teacher scores: min / max | {te['min']:.4g} / {te['max']:.4g} |",
                  f"| teacher mean: positives / negatives | {te['positive_mean']:.4g} / {te['negative_mean']:.4g} |",
                  f"| positive above negative (of {te['pairs']} pairs) | {100 * te['share_positive_above']:.1f}% |",
                  f"| mean margin | {te['margin_mean']:.4g} |"]
    return "\n".join(lines) + "\n\n![figures](inspect.png)\n"


def plot(report: Mapping[str, Any], path: Path, bins: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("question_tokens", "question tokens"), ("passage_tokens", "passage tokens")]
    te = report.get("teacher")
    fig, axes = plt.subplots(1, 3 if te else 2, figsize=(5 * (3 if te else 2), 3.6))
    for ax, (key, title) in zip(axes, panels):
        t = report[key]
        if t["lengths"]:
            ax.hist(t["lengths"], bins=bins, color="#4C72B0")
        ax.axvline(t["max_length"], color="#C44E52", linestyle="--", label=f"max length {t['max_length']}")
        ax.set_title(f"{title} ({100 * t['share_truncated']:.1f}% truncated)")
        ax.legend()
    if te:
        ax = axes[2]
        if te["margins"]:
            ax.hist(te["margins"], bins=bins, color="#55A868")
        ax.axvline(0.0, color="#C44E52", linestyle="--")
        ax.set_title(f"teacher: positive - negative ({100 * te['share_positive_above']:.0f}% > 0)")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)


def write_report(report: Mapping[str, Any], output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    plot(report, output / "inspect.png", int(report["settings"]["inspect"]["bins"]))
    write_text_atomic(output / "inspect.md", markdown(report))
    write_json_atomic(output / "inspect.json", _strip(report))  # last: its presence means the report is whole
