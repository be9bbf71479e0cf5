"""Markdown rendering of an evaluation report (the readable twin of report.json)."""

from __future__ import annotations

import json
from typing import Any, Mapping


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f}"


def _with_ci(value: float, ci: list[float] | None) -> str:
    if not ci:
        return _pct(value)
    return f"{_pct(value)} [{_pct(ci[0])}, {_pct(ci[1])}]"


def _p(p: float) -> str:
    if p != p:  # NaN
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _notes(notes: Mapping[str, Any]) -> list[str]:
    if not notes:
        return []
    lines = ["", "## Notes", ""]
    for key, value in notes.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        lines.append(f"- **{key}**: {shown}")
    return lines


def render_qa_markdown(report: Mapping[str, Any]) -> str:
    ks = report["ks"]
    lines = [
        "# Retrieval evaluation (top-k accuracy)",
        "",
        f"{report['num_questions']} questions; answer matching: `{report['match']}` "
        f"(has_answer recomputed from the passage texts). Figures in %, with 95% bootstrap intervals "
        f"({report['bootstrap']['resamples']} resamples, seed {report['bootstrap']['seed']}).",
        "",
        f"> {report['note']}",
        "",
    ]
    rows = []
    for name, sysrep in report["systems"].items():
        rows.append([name] + [_with_ci(sysrep["top_k"][str(k)], sysrep["ci95"].get(str(k))) for k in ks])
    lines += _table(["system"] + [f"top-{k}" for k in ks], rows)

    short = [f"{n} ({s['min_ctxs']} passages)" for n, s in report["systems"].items() if s["min_ctxs"] < max(ks)]
    if short:
        lines += ["", f"Warning: fewer than {max(ks)} passages for some questions in: {', '.join(short)}."]

    if report["comparisons"]:
        lines += ["", "## Paired comparisons", "",
                  "Difference A − B in points; p-values: paired bootstrap / exact sign test (McNemar).", ""]
        rows = []
        for comp in report["comparisons"]:
            for k in ks:
                c = comp["top_k"][str(k)]
                rows.append([comp["a"], comp["b"], str(k), f"{100.0 * c['delta']:+.1f}",
                             _p(c["p_bootstrap"]), _p(c["p_sign"])])
        lines += _table(["A", "B", "k", "Δ", "p (bootstrap)", "p (sign)"], rows)

        k_ov = report["comparisons"][0]["overlap"]["k"]
        lines += ["", f"## Overlap of questions answered in the top {k_ov}", ""]
        rows = [[c["a"], c["b"], str(c["overlap"]["both"]), str(c["overlap"]["only_a"]),
                 str(c["overlap"]["only_b"]), str(c["overlap"]["neither"])] for c in report["comparisons"]]
        lines += _table(["A", "B", "both", "only A", "only B", "neither"], rows)
    if "reader" in report:
        lines += render_reader_section(report)
    lines += render_rerank_section(report)
    lines += _notes(report.get("notes", {}))
    lines += ["", "![top-k accuracy](topk.png)", ""]
    return "\n".join(lines)


def render_reader_section(report: Mapping[str, Any]) -> list[str]:
    """The reader beside the bound: per system and k, top-k accuracy, reader EM/F1, and how often EM
    counted a question that has_answer found in no top-k passage (the two matchers differ slightly)."""
    reader = report["reader"]
    details = report.get("notes", {}).get("reader", {})
    above = details.get("em_above_bound", {})
    lines = ["", "## Reader (extractive, SQuAD v1.1 EM/F1)", "",
             "The bound is top-k accuracy; the gap bound − EM is the reader's share of the loss, "
             "100 − bound the retriever's. Figures in %.", "",
             f"Gold passages ({details.get('gold_passages', 'gold')}): EM {_pct(reader['gold']['em'])}, "
             f"F1 {_pct(reader['gold']['f1'])}.", ""]
    rows = []
    for name, per_k in reader["systems"].items():
        bound = report["systems"].get(name, {}).get("top_k", {})
        for k, fig in per_k.items():
            rows.append([name, k, _pct(bound[k]) if k in bound else "n/a", _pct(fig["em"]), _pct(fig["f1"]),
                         str(above.get(name, {}).get(k, "n/a"))])
    lines += _table(["system", "k", "top-k (bound)", "reader EM", "reader F1", "EM above bound (questions)"], rows)
    n = details.get("num_questions")
    if n is not None and n != report.get("num_questions"):
        lines += ["", f"Open-domain reader figures on the first {n} of the {report['num_questions']} questions "
                      "(reader_cfg.eval.max_questions); the bound is over all of them."]
    if details.get("seconds"):
        lines += ["", f"Reader wall time (s): {json.dumps(details['seconds'])}."]
    return lines


def render_rerank_section(report: Mapping[str, Any]) -> list[str]:
    """The cross-encoder's depth K per first stage (chosen on dev), the dev figure at each K and the
    reranking time (``notes["rerank"]``, written by `dpr.rerank.pipeline`); nothing without it."""
    rerank = report.get("notes", {}).get("rerank")
    if not rerank:
        return []
    metric = str(rerank["metric"]).split(" ")[0]
    lines = ["", "## Reranking (cross-encoder)", "",
             f"Each first stage's top K reordered by the cross-encoder (w > 0: by minmax(logit) + w * "
             f"minmax(first-stage score) over the top K), K and w chosen by dev {metric} "
             f"(ties to the smaller); the passages below K keep the first stage's order. \"kept\": reranking "
             f"lowered that system on dev, so its row is the first stage's own list.", ""]
    rows = []
    for name, r in rerank["systems"].items():
        per_k = ", ".join(f"{k}: {_pct(v[metric])}" for k, v in r["dev"].items())
        w = str(r.get("weight", 0.0)) + (" (kept)" if r.get("kept_first_stage") else "")
        rows.append([name, str(r["k"]), w, _pct(r["dev_first_stage"][metric]), per_k,
                     f"{1000.0 * r['seconds_per_question']:.1f}"])
    lines += _table(["system", "K", "w", f"dev {metric} before", f"dev {metric} by K", "ms per question (test)"], rows)
    return lines


def render_qrels_markdown(report: Mapping[str, Any]) -> str:
    metrics = report["metrics"]
    lines = [
        "# Retrieval evaluation (qrels)",
        "",
        f"{report['num_queries']} queries from `{report['qrels']}`. Figures in %, with 95% bootstrap intervals "
        f"({report['bootstrap']['resamples']} resamples, seed {report['bootstrap']['seed']}).",
        "",
        f"> {report['note']}",
        "",
    ]
    rows = [[name] + [_with_ci(s[m], s["ci95"].get(m)) for m in metrics] for name, s in report["systems"].items()]
    lines += _table(["system"] + metrics, rows)
    if report["comparisons"]:
        lines += ["", "## Paired comparisons", "",
                  "Difference A − B in points; p-values: paired bootstrap / exact sign test over queries.", ""]
        rows = []
        for comp in report["comparisons"]:
            for m in metrics:
                c = comp["metrics"][m]
                rows.append([comp["a"], comp["b"], m, f"{100.0 * c['delta']:+.1f}",
                             _p(c["p_bootstrap"]), _p(c["p_sign"])])
        lines += _table(["A", "B", "metric", "Δ", "p (bootstrap)", "p (sign)"], rows)
    lines += render_rerank_section(report)
    lines += _notes(report.get("notes", {}))
    lines += ["", "![Recall@k](topk.png)", ""]
    return "\n".join(lines)
