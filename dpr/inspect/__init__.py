"""``dpr-data inspect``: what is in a prepared dataset before training on it, and the findings that
predict a failed training as WARNINGs (with their thresholds, `dpr.inspect.config.InspectConfig`).

`inspect_dataset(root, cfg, output)` writes ``inspect.json``, ``inspect.md`` and ``inspect.png``;
`dataset_warnings(root, cfg)` returns the warnings alone (what ``dpr-train`` can log at its start).
``cfg`` is a training config (mapping): ``model`` (tokenizer, max lengths, prefixes), ``train``
(``batch_size``, ``hard_negatives``) and optionally ``inspect`` (thresholds); absent keys take the
defaults of `BiEncoderConfig`, `TrainConfig` and `InspectConfig`.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable, Mapping

from dpr.data.dataset import DatasetPaths
from dpr.data.formats.scores import FILE_NAME as SCORES_FILE, read_teacher_scores
from dpr.data.passages import count_passages, iter_passages
from dpr.data.retriever_json import read_retriever_json
from dpr.inspect import figures
from dpr.inspect.config import InspectConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Settings:
    model_name: str
    question_max_length: int
    passage_max_length: int
    question_prefix: str
    passage_prefix: str
    batch_size: int
    hard_negatives: int
    inspect: InspectConfig


def _settings(cfg: Mapping[str, Any] | None) -> _Settings:
    from dpr.models import BiEncoderConfig
    from dpr.training.config import TrainConfig

    cfg = dict(cfg or {})
    model = {**dataclasses.asdict(BiEncoderConfig()), **dict(cfg.get("model") or {})}
    train = {**dataclasses.asdict(TrainConfig()), **dict(cfg.get("train") or {})}
    return _Settings(str(model["name"]), int(model["question_max_length"]), int(model["passage_max_length"]),
                     str(model.get("question_prefix") or ""), str(model.get("passage_prefix") or ""),
                     int(train["batch_size"]), int(train["hard_negatives"]), InspectConfig.from_dict(cfg.get("inspect")))


def _tokenizer_path(name: str, tower: str) -> str:
    from dpr.models.run_format import tokenizer_dir

    return tokenizer_dir(name, tower)  # a dpr run dir: each tower has its tokenizer


def make_tokenize(model_name: str, tower: str, prefix: str) -> Callable[[list[str], list[str] | None], list[int]]:
    """Token counts as the towers see the inputs: the prefix applied, a titled passage as the pair
    (title, text), special tokens included, nothing truncated."""
    from transformers import AutoTokenizer

    from dpr.models.inference import with_prefix

    tok = AutoTokenizer.from_pretrained(_tokenizer_path(model_name, tower))

    def tokenize(texts: list[str], titles: list[str] | None) -> list[int]:
        texts, titles = with_prefix(texts, titles, prefix)
        out = [0] * len(texts)
        singles = [i for i in range(len(texts)) if not titles or not titles[i]]
        pairs = [i for i in range(len(texts)) if titles and titles[i]]
        if singles:
            for i, ids in zip(singles, tok([texts[i] for i in singles], verbose=False)["input_ids"]):
                out[i] = len(ids)
        if pairs:
            enc = tok([titles[i] for i in pairs], [texts[i] for i in pairs], verbose=False)["input_ids"]
            for i, ids in zip(pairs, enc):
                out[i] = len(ids)
        return out

    return tokenize


def _passage_sample(path: Path, ic: InspectConfig) -> tuple[int, list[dict]]:
    """The number of passages and a seeded sample of at most ``ic.max_passages``, streamed (a 21M-passage
    corpus never becomes a list)."""
    if not path.is_file():
        return 0, []
    n = count_passages(path)
    keep = set(figures.sample(range(n), ic.max_passages, ic.seed))
    return n, [p for i, p in enumerate(iter_passages(path, check_unique=False)) if i in keep]


def compute(root: str | Path, cfg: Mapping[str, Any] | None = None) -> dict:
    """Every figure of the report, and its warnings (``report["warnings"]``)."""
    ds = DatasetPaths(root)
    if not ds.train.is_file():
        raise FileNotFoundError(f"{ds.train}: no prepared dataset here (prepare it with dpr-data first)")
    st = _settings(cfg)
    ic = st.inspect
    kind = ds.kind
    train = read_retriever_json(ds.train)
    dev = read_retriever_json(ds.dev) if ds.dev.is_file() else []
    n_passages, ps = _passage_sample(ds.passages, ic)
    report: dict[str, Any] = {"dataset": str(ds.root), "kind": kind, "model": st.model_name,
                              "settings": {"batch_size": st.batch_size, "hard_negatives": st.hard_negatives,
                                           "inspect": dataclasses.asdict(ic)}}
    report["counts"] = figures.counts(train, dev, n_passages)
    report["shared_positives"] = figures.shared_positives(train, st.batch_size)
    report["false_negatives"] = figures.false_negatives(train, kind)
    qs = figures.sample([ex["question"] for ex in train], ic.max_questions, ic.seed)
    report["question_tokens"] = figures.token_lengths(
        make_tokenize(st.model_name, "question", st.question_prefix), qs, None, st.question_max_length)
    report["passage_tokens"] = figures.token_lengths(
        make_tokenize(st.model_name, "passage", st.passage_prefix), [p["text"] for p in ps],
        [p["title"] for p in ps], st.passage_max_length)
    report["teacher"] = figures.teacher(train, read_teacher_scores(ds.root / SCORES_FILE), ic.bins)
    report["warnings"] = warnings_of(report, st)
    return report


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def warnings_of(report: Mapping[str, Any], st: _Settings) -> list[str]:
    """The findings above their thresholds, one line each."""
    ic, c, out = st.inspect, report["counts"], []
    empty = [what for what, n in (("training questions", c["questions"]["train"]), ("passages", c["passages"]))
             if n == 0]
    if empty:  # every share below is of nothing, so no other warning could ever fire
        out.append(f"WARNING: the dataset has no {' and no '.join(empty)}: there is nothing to train on "
                   "(prepare it again from a file that holds records)")
    if st.hard_negatives > 0 and c["share_without_negatives"] > ic.no_negatives_max:
        out.append(f"WARNING: {_pct(c['share_without_negatives'])} of the training questions have no negative "
                   f"(train.hard_negatives={st.hard_negatives}; threshold {_pct(ic.no_negatives_max)}): "
                   "mine some with dpr-bm25 mine=true")
    if c["share_without_positives"] > ic.no_positives_max:
        out.append(f"WARNING: {_pct(c['share_without_positives'])} of the training questions have no positive "
                   f"passage and are skipped (threshold {_pct(ic.no_positives_max)})")
    fn = report["false_negatives"]
    if fn["false_negative_rate"] > ic.false_negative_max:
        out.append(f"WARNING: {_pct(fn['false_negative_rate'])} of the mined negatives are false negatives "
                   f"({fn['judged_relevant']} judged relevant, {fn['contain_answer']} contain the answer; "
                   f"threshold {_pct(ic.false_negative_max)})")
    for key, what, knob in (("question_tokens", "questions", "model.question_max_length"),
                            ("passage_tokens", "passages", "model.passage_max_length")):
        t = report[key]
        if t["share_truncated"] > ic.truncated_max:
            out.append(f"WARNING: {_pct(t['share_truncated'])} of the {what} are longer than {knob}={t['max_length']} "
                       f"tokens and get truncated (threshold {_pct(ic.truncated_max)}; p95 {t['p95']:.0f} tokens)")
    te = report.get("teacher")
    if te and te["pairs"] and te["share_positive_above"] < ic.teacher_min_separation:
        out.append(f"WARNING: the teacher scores the positive above the negative in only "
                   f"{_pct(te['share_positive_above'])} of {te['pairs']} pairs (threshold "
                   f"{_pct(ic.teacher_min_separation)}): its scores do not separate positives from negatives")
    return out


def dataset_warnings(ds_root: str | Path, cfg: Mapping[str, Any] | None = None) -> list[str]:
    """The WARNING lines `inspect_dataset` would report for training ``ds_root`` with ``cfg``."""
    return compute(ds_root, cfg)["warnings"]


def inspect_dataset(root: str | Path, cfg: Mapping[str, Any] | None, output: str | Path) -> dict:
    """Write ``<output>/inspect.json``, ``inspect.md`` and ``inspect.png``; returns the report."""
    from dpr.inspect.report import write_report

    report = compute(root, cfg)
    write_report(report, Path(output))
    return report


__all__ = ["inspect_dataset", "dataset_warnings", "compute", "warnings_of", "InspectConfig"]
