"""Model cards in the Hugging Face layout (YAML metadata + markdown), for run directories and exports.

``write_model_card(dir)`` writes ``<dir>/README.md`` from what the run recorded: ``biencoder.json``
(base model, towers, pooling, similarity, lengths), ``train_summary.json`` (training data, loss,
batch, negatives, steps, precision, wall time) and an evaluation ``report.json`` from ``dpr-eval`` /
``dpr-pipeline`` (the table against BM25; its ``topk.png`` is copied beside the card). Every fact
is read, never assumed: what a run did not record is left out.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any, Mapping

import yaml

from dpr.atomic import write_text_atomic
from dpr.output_sets import check_file_manifest
from dpr.errors import DataError

log = logging.getLogger(__name__)

CARD_FILE = "README.md"
PLOT_FILE = "topk.png"
HUB_NAMES = {"all-MiniLM-L6-v2": "sentence-transformers/all-MiniLM-L6-v2",
             "minilm": "sentence-transformers/all-MiniLM-L6-v2"}
# report metric → (model-index type, readable name)
QRELS_METRICS = {"ndcg@10": ("ndcg_at_10", "nDCG@10"), "mrr@10": ("mrr_at_10", "MRR@10"),
                 "recall@10": ("recall_at_10", "Recall@10"), "recall@100": ("recall_at_100", "Recall@100")}
DPR_CITATION = """@inproceedings{karpukhin-etal-2020-dense,
  title = {Dense Passage Retrieval for Open-Domain Question Answering},
  author = {Karpukhin, Vladimir and O{\\u{g}}uz, Barlas and Min, Sewon and Lewis, Patrick and Wu, Ledell and
            Edunov, Sergey and Chen, Danqi and Yih, Wen-tau},
  booktitle = {Proceedings of EMNLP 2020},
  year = {2020}
}"""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(path, f"invalid JSON: {err.msg}", line=err.lineno) from None


def _find_report(run_dir: Path) -> Path | None:
    """The pipeline's report for a run: ``<out>/model`` is evaluated in ``<out>/eval/report.json``."""
    for candidate in (run_dir / "eval" / "report.json", run_dir.parent / "eval" / "report.json"):
        if candidate.is_file():
            return candidate
    return None


def card_facts(run_dir: str | Path, report: str | Path | None = None) -> dict[str, Any]:
    """What a card says, gathered from the run directory (and the report, found when not given)."""
    from dpr.models import read_biencoder_config

    run_dir = Path(run_dir)
    config = read_biencoder_config(run_dir)
    summary_path = run_dir / "train_summary.json"
    summary = _read_json(summary_path) if summary_path.is_file() else None
    report_path = Path(report) if report is not None else _find_report(run_dir)
    if report_path is not None and not report_path.is_file():
        raise FileNotFoundError(f"{report_path}: no such evaluation report")
    rep = _read_json(report_path) if report_path is not None else None
    if rep is not None and (not isinstance(rep, dict) or rep.get("kind") not in ("qa", "qrels")):
        raise DataError(report_path, "not a dpr-eval report (expected kind 'qa' or 'qrels')", field="kind")
    if rep is not None:  # its report.md and topk.png (copied beside the card) are the ones it was written with
        check_file_manifest(report_path, rep.get("files"), report_path.parent, "run dpr-eval again to write the report")
    conf = (summary or {}).get("config") or {}
    hydra_cfg = run_dir / ".hydra" / "config.yaml"
    if not conf and hydra_cfg.is_file():  # the composed config dpr-train saved, when the summary lacks it
        conf = yaml.safe_load(hydra_cfg.read_text(encoding="utf-8")) or {}
    data = conf.get("data") or {}
    meta = None
    if data.get("name") and conf.get("data_dir"):
        meta_path = Path(conf["data_dir"]) / data["name"] / "meta.json"
        meta = _read_json(meta_path) if meta_path.is_file() else None
        train_path = Path(conf["data_dir"]) / data["name"] / "train.json"
        if not ((meta or {}).get("counts") or {}).get("questions") and train_path.is_file():
            examples = _read_json(train_path)  # a dataset prepared elsewhere: count its training questions
            meta = {**(meta or {}), "counts": {"questions": {"train": len(examples)}}}
    return {"config": config, "summary": summary, "report": rep, "report_path": report_path,
            "dataset": data.get("name") or (rep or {}).get("notes", {}).get("dataset"),
            "dataset_meta": meta, "train": conf.get("train") or {}, "loss": conf.get("loss"),
            "seed": conf.get("seed")}


# ------------------------------------------------------------------------------------------ metadata

def _base_model(name: str) -> str | None:
    if name in HUB_NAMES:
        return HUB_NAMES[name]
    return None if Path(name).exists() else name  # a local path is no hub id


def _model_index(facts: Mapping[str, Any], model_name: str) -> list[dict] | None:
    rep = facts["report"]
    if not rep:
        return None
    systems = rep["systems"]
    system = "dense" if "dense" in systems else next(iter(systems))
    sysrep = systems[system]
    if rep["kind"] == "qa":
        metrics = [{"type": f"top_{k}_accuracy", "name": f"Top-{k} accuracy ({system})",
                    "value": round(100 * float(sysrep["top_k"][str(k)]), 2)} for k in rep["ks"]]
    else:
        metrics = [{"type": QRELS_METRICS.get(m, (m.replace("@", "_at_"), m))[0],
                    "name": f"{QRELS_METRICS.get(m, (m, m))[1]} ({system})", "value": round(float(sysrep[m]), 4)}
                   for m in rep["metrics"]]
    dataset = facts["dataset"] or "unknown"
    return [{"name": model_name, "results": [{
        "task": {"type": "retrieval", "name": "Passage retrieval"},
        "dataset": {"name": dataset, "type": dataset, "split": "test"},
        "metrics": metrics,
    }]}]


def card_metadata(facts: Mapping[str, Any], exported: bool, model_name: str) -> dict[str, Any]:
    """The YAML front matter: library, tags, base model, datasets, metrics, model-index."""
    rep = facts["report"]
    meta: dict[str, Any] = {
        "library_name": "sentence-transformers" if exported else "transformers",
        "pipeline_tag": "sentence-similarity" if exported else "feature-extraction",
        "tags": ["dense-retrieval", "dpr", "bi-encoder", "passage-retrieval"]
                + (["sentence-transformers", "sentence-similarity", "feature-extraction"] if exported else []),
    }
    base = _base_model(facts["config"].name)
    if base:
        meta["base_model"] = base
    if facts["dataset"]:
        meta["datasets"] = [facts["dataset"]]
    if rep:
        meta["metrics"] = ([f"top_{k}_accuracy" for k in rep["ks"]] if rep["kind"] == "qa"
                           else [QRELS_METRICS.get(m, (m.replace("@", "_at_"),))[0] for m in rep["metrics"]])
        meta["model-index"] = _model_index(facts, model_name)
    return meta


# -------------------------------------------------------------------------------------------- body

def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
            + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def _model_section(cfg: Any) -> list[str]:
    rows = [
        ["base model", f"`{cfg.name}`"],
        ["towers", "one shared encoder" if cfg.shared else "separate question and passage encoders (DPR)"],
        ["pooling", cfg.pooling],
        ["projection", f"linear to {cfg.projection_dim} dims" if cfg.projection_dim else "none"],
        ["similarity", f"{cfg.similarity} (temperature {cfg.temperature:g})"],
        ["max length", f"questions {cfg.question_max_length} tokens, passages {cfg.passage_max_length} tokens"],
    ]
    if cfg.question_prefix or cfg.passage_prefix:
        rows.append(["prefixes", f"questions `{cfg.question_prefix!r}`, passages `{cfg.passage_prefix!r}` "
                                 "(before the title where there is one; the export's query / document prompts)"])
    return ["## Model", ""] + _table(["", ""], rows)


def _training_section(facts: Mapping[str, Any]) -> list[str]:
    summary, tc = facts["summary"], facts["train"]
    if not summary:
        return ["## Training", "", "No `train_summary.json` in the run directory: training details unknown "
                "(an untrained starting point, or a run trained elsewhere)."]
    if summary.get("rounds") is not None:  # the pipeline's re-mining rounds (no train key; older runs: train.rounds)
        tc = {**tc, "rounds": summary["rounds"]}
    world = summary.get("world_size") or 1
    batch = tc.get("batch_size")
    lines = ["## Training", ""]
    data = facts["dataset"]
    counts = (facts["dataset_meta"] or {}).get("counts") or {}
    train_q = (counts.get("questions") or {}).get("train") or (counts.get("examples") or {}).get("train")
    if data:
        lines.append(f"Training data: `{data}`" + (f", {train_q:,} training questions" if train_q else "") + ".")
    loss = facts["loss"]
    loss_text = (json.dumps(loss) if loss else "softmax cross-entropy of each question over the pool of every "
                 "positive and hard negative passage in the (all-gathered) batch (DPR's NLL)")
    rows = [["loss", loss_text]]
    if batch is not None:
        pool = batch * world * (1 + int(tc.get("hard_negatives") or 0))
        rows.append(["batch", f"{batch} questions per device x {world} device(s); {pool} passages in the pool"])
    for key, label in (("hard_negatives", "BM25 hard negatives per question"), ("lr", "learning rate"),
                       ("warmup_ratio", "warm-up ratio"), ("grad_accumulation_steps", "gradient accumulation"),
                       ("grad_cache_chunk_size", "gradient cache chunk (0: off)"),
                       ("frozen_steps", "frozen-index steps (question tower vs the cached corpus)"),
                       ("corpus_negatives", "whole-corpus negatives term"), ("mask_answers", "answer-bearing passages masked"),
                       ("multi_positive", "every judged positive a positive"), ("rounds", "re-mining rounds")):
        if key in tc:  # an "auto" setting as the run resolved it
            rows.append([label, (summary.get("resolved") or {}).get(key, tc[key])])
    if tc.get("attention_dropout") is not None:  # a training-only lever: the saved config keeps the model's own
        rows.append(["attention dropout (training only)", f"{tc['attention_dropout']:g}"])
    rows.append(["steps", f"{summary.get('steps')} (epoch {summary.get('epoch')})"])
    if batch is not None and summary.get("steps") is not None:
        rows.append(["examples seen", f"{summary['steps'] * batch * world * int(tc.get('grad_accumulation_steps') or 1):,}"])
    rows.append(["precision", summary.get("precision")])
    if facts["seed"] is not None:
        rows.append(["seed", facts["seed"]])
    rows.append(["kept weights", summary.get("final_weights")])
    if summary.get("train_seconds") is not None:
        rows.append(["training time", f"{summary['train_seconds'] / 60:.1f} min"])
    return lines + [""] + _table(["setting", "value"], rows)


def _evaluation_section(facts: Mapping[str, Any], plot: str | None) -> list[str]:
    rep = facts["report"]
    if not rep:
        return ["## Evaluation", "", "No evaluation report yet: `dpr-pipeline` (or `dpr-eval`) writes one, and "
                "`write_model_card(dir, report=...)` puts it here."]
    systems = rep["systems"]
    lines = ["## Evaluation against BM25", ""]
    if rep["kind"] == "qa":
        ks = rep["ks"]
        lines.append(f"Top-k accuracy in % (an answer string in the top k passages) on {rep['num_questions']} test "
                     f"questions of `{facts['dataset'] or 'the dataset'}` against the whole corpus:")
        header = ["system"] + [f"top-{k}" for k in ks]
        rows = [[name] + [f"{100 * float(s['top_k'][str(k)]):.1f}" for k in ks] for name, s in systems.items()]
        key, fmt = (lambda s: float(s["top_k"]["20" if "20" in s["top_k"] else str(ks[-1])]) * 100), "{:+.1f}"
        delta_name = "top-20" if 20 in ks else f"top-{ks[-1]}"
    else:
        metrics = rep["metrics"]
        lines.append(f"{rep['num_queries']} test queries of `{facts['dataset'] or 'the dataset'}` (qrels metrics):")
        header = ["system"] + [QRELS_METRICS.get(m, (m, m))[1] for m in metrics]
        rows = [[name] + [f"{float(s[m]):.4f}" for m in metrics] for name, s in systems.items()]
        main = "ndcg@10" if "ndcg@10" in metrics else metrics[0]
        key, fmt, delta_name = (lambda s: float(s[main])), "{:+.4f}", QRELS_METRICS.get(main, (main, main))[1]
    if "bm25" in systems:
        base = key(systems["bm25"])
        header.append(f"{delta_name} vs BM25")
        for row, s in zip(rows, systems.values()):
            row.append(fmt.format(key(s) - base))
    lines += [""] + _table(header, rows)
    if plot:
        lines += ["", f"![top-k curves]({plot})"]
    return lines


def _usage_section(exported: bool, cfg: Any) -> list[str]:
    from dpr.models.run_format import usage_note

    if exported:
        pair_note = "passages (with a title: `(title, text)` pairs, as in training)"
        return ["## Usage (sentence-transformers)", "", "```python", "from sentence_transformers import SentenceTransformer",
                "", "model = SentenceTransformer(\"path/to/this/directory\")",
                "q = model.encode_query([\"who wrote hamlet?\"])",
                "p = model.encode_document([(\"Hamlet\", \"Hamlet is a tragedy by William Shakespeare.\")])",
                "print(model.similarity(q, p))", "```", "",
                f"Questions go through `encode_query`, {pair_note} through `encode_document`"
                + ("" if cfg.shared else " (each through its own tower)") + "."
                + (" The run's LoRA adapters are merged into the base model's weights here (a plain model: no "
                   "`peft` needed)." if getattr(cfg, "lora", None) is not None else ""),
                "", "## Sharing it", "", "With a Hugging Face token (`huggingface-cli login` or `HF_TOKEN`):", "",
                "```python", "model.push_to_hub(\"your-name/your-retriever\")", "```"]
    return ["## Usage (dpr)", "", "```python", "from dpr import Retriever", "",
            "retriever = Retriever.dense(\"path/to/this/run\", \"index.faiss\", passages=\"passages.tsv\")",
            "for hit in retriever.search([\"who wrote hamlet?\"], k=5)[0]:", "    print(hit.score, hit.title)", "```",
            "", usage_note(getattr(cfg, "lora", None) is not None)
            + "`dpr-export model=<this dir> format=sentence-transformers output=<dir>` makes a sentence-transformers copy.",
            "", "## Sharing it", "", "With a Hugging Face token (`huggingface-cli login` or `HF_TOKEN`):", "",
            "```python", "from huggingface_hub import HfApi", "",
            "HfApi().upload_folder(folder_path=\"path/to/this/run\", repo_id=\"your-name/your-retriever\",",
            "                      ignore_patterns=[\"checkpoints/*\"])", "```"]


def _truncation_note(dim: int | None, cfg: Any) -> list[str]:
    """Under Usage, for an export that records a Matryoshka ``truncate_dim``: what encode returns, and how to get the
    vectors dpr computes at that size (sentence-transformers cuts after the model's normalisation)."""
    if not dim:
        return []
    cosine = cfg.similarity == "cosine"
    return ["", f"This copy records `truncate_dim: {dim}` (`config_sentence_transformers.json`): `encode_query` and "
            f"`encode_document` return each vector's first {dim} coordinates (Matryoshka); "
            "`SentenceTransformer(path, truncate_dim=None)` gives the full vectors."
            + (" sentence-transformers truncates after the model's normalisation: pass `normalize_embeddings=True` "
               "for unit vectors (what `dpr-encode dim=" + str(dim) + "` stores); `model.similarity` (cosine) ranks "
               "the same either way." if cosine else " The prefix is what `dpr-encode dim=" + str(dim)
               + "` stores (dot product: no re-normalisation).")]


def render_model_card(facts: Mapping[str, Any], exported: bool, model_name: str, plot: str | None = None) -> str:
    """The card text: YAML front matter, then the markdown body."""
    cfg = facts["config"]
    meta = yaml.safe_dump(card_metadata(facts, exported, model_name), sort_keys=False, allow_unicode=True)
    intro = (f"A dense passage retriever (a question and a passage encoder) fine-tuned from `{cfg.name}` with "
             "`dpr` on " + (f"`{facts['dataset']}`" if facts["dataset"] else "its data")
             + ". Questions and passages are embedded separately; a passage's score is the "
             + ("cosine" if cfg.similarity == "cosine" else "dot product") + " of the two vectors.")
    body = [f"# {model_name}", "", intro, "", *_model_section(cfg), "", *_usage_section(exported, cfg),
            *_truncation_note(facts.get("truncate_dim"), cfg), "",
            *_training_section(facts), "", *_evaluation_section(facts, plot), "", "## Citation", "",
            "```bibtex", DPR_CITATION, "```", ""]
    return f"---\n{meta}---\n\n" + "\n".join(body)


def write_model_card(target_dir: str | Path, report: str | Path | None = None, *, run_dir: str | Path | None = None,
                     model_name: str | None = None, truncate_dim: int | None = None) -> Path:
    """Write ``<target_dir>/README.md`` (and copy the report's ``topk.png`` beside it).

    ``target_dir`` is a run directory (the trainer's ``output_dir``), or an export of one with
    ``run_dir`` naming the run. ``report`` is an evaluation ``report.json``; by default the pipeline's
    ``<run>/../eval/report.json`` when there is one. ``truncate_dim``: the export's Matryoshka size (its
    ``config_sentence_transformers.json``), stated under Usage. Returns the card's path.
    """
    target = Path(target_dir)
    run = Path(run_dir) if run_dir is not None else target
    exported = (target / "modules.json").is_file()
    facts = {**card_facts(run, report), "truncate_dim": truncate_dim}
    plot = None
    if facts["report_path"] is not None:
        src = facts["report_path"].parent / PLOT_FILE
        if src.is_file():
            shutil.copyfile(src, target / PLOT_FILE)
            plot = PLOT_FILE
    name = model_name or (f"dpr-{facts['dataset']}" if facts["dataset"] else target.resolve().name)
    path = target / CARD_FILE
    write_text_atomic(path, render_model_card(facts, exported, name, plot))
    log.info("wrote model card %s", path)
    return path


def read_card_metadata(path: str | Path) -> dict[str, Any]:
    """The YAML front matter of a card (what the Hub reads)."""
    text = Path(path).read_text(encoding="utf-8")
    if not text.startswith("---\n") or "\n---\n" not in text[4:]:
        raise DataError(path, "no YAML front matter (--- ... ---) at the top", line=1)
    return yaml.safe_load(text[4:text.index("\n---\n", 4)]) or {}
