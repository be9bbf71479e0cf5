"""A trained cross-encoder directory (`dpr.rerank.model`) → a sentence-transformers ``CrossEncoder``
directory with a model card (loads offline with ``CrossEncoder(<dir>)``).

The cross-encoder already is a one-label ``AutoModelForSequenceClassification``, the model class
``CrossEncoder`` wraps (a LoRA one: with its adapters merged into the base, `dpr.rerank.model.plain_encoder_dir`),
so the export is sentence-transformers' own save of it: the maximum length it was
trained with, and the Identity activation so ``predict`` returns the logit `dpr.rerank.score.score_pairs`
returns (not its sigmoid). Passages go in as ``title [SEP] text`` (`dpr.rerank.model.document_text`), as
in training; the card says so.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

from dpr.atomic import atomic_path, check_replaceable
from dpr.errors import DataError
from dpr.export.marker import owned_by, write_marker

log = logging.getLogger(__name__)


def build_cross_encoder_st(ce_dir: str | Path) -> Any:
    """The `sentence_transformers.CrossEncoder` equivalent of ``ce_dir`` (in memory, CPU)."""
    try:
        import torch
        from sentence_transformers import CrossEncoder
    except ImportError as err:
        raise ImportError(f"the sentence-transformers export needs sentence-transformers>=6.2 "
                          f"(pip install 'dpr[export]'): {err}") from None
    from dpr.rerank.model import load_cross_encoder, plain_encoder_dir, resolve_dir

    ce_dir = resolve_dir(ce_dir)
    _, _, settings = load_cross_encoder(ce_dir)  # validates the directory
    with plain_encoder_dir(ce_dir) as encoder:  # a LoRA cross-encoder's adapters merged into its base (in memory)
        return CrossEncoder(str(encoder), device="cpu", local_files_only=True,
                            max_length=int(settings["max_length"]), activation_fn=torch.nn.Identity()), settings


def _card(ce_dir: Path, settings: dict, model_name: str) -> str:
    base = settings.get("base_model", "?")
    title_note = ("the passage as `f\"{title} [SEP] {text}\"` (the tokenizer's separator token; the text alone "
                  "where there is no title)") if settings["title"] else "the passage text alone"
    return "\n".join([
        "---", "library_name: sentence-transformers", "pipeline_tag: text-ranking",
        "tags:", "- cross-encoder", "- reranker", "- dpr", "---", "",
        f"# {model_name}", "",
        "A cross-encoder reranker trained with [dpr](https://github.com/) (`dpr-rerank train`): "
        f"`{base}` with a one-logit head over `[CLS] question [SEP] title [SEP] passage [SEP]`."
        + (" It was trained with LoRA adapters (`rerank.model.lora`), merged into the base model's weights here "
           "(a plain model: no `peft` needed)." if settings.get("lora") else ""), "",
        "## Usage", "", "```python", "from sentence_transformers import CrossEncoder", "",
        f"model = CrossEncoder(\"{model_name}\")",
        "scores = model.predict([(\"who wrote hamlet\", \"Hamlet [SEP] Hamlet is a tragedy by William Shakespeare.\")])",
        "```", "",
        f"Pass the question first and {title_note}. Scores are raw logits (higher is more relevant); "
        f"inputs are cut at {settings['max_length']} tokens, longest segment first.", "",
        "## Training", "",
        f"- trained steps: {settings.get('trained_steps', '?')}; data kind: {settings.get('kind', '?')}",
        f"- source directory: `{ce_dir}`", "",
    ])


def export_cross_encoder(ce_dir: str | Path, output: str | Path, *, model_name: str | None = None) -> Path:
    """Write ``ce_dir`` as a sentence-transformers CrossEncoder directory at ``output`` (built aside, renamed
    into place), with a model card as its ``README.md``."""
    from dpr.rerank.model import resolve_dir

    output = Path(output)
    if output.exists() and not output.is_dir():
        raise DataError(output, "exists and is not a directory", field="output")
    if Path(ce_dir).resolve().is_relative_to(output.resolve()):
        raise DataError(output, f"would replace the cross-encoder directory {ce_dir} it exports", field="output")
    owned = owned_by(ce_dir)  # an export of this cross-encoder (again) may be replaced; anything else is refused
    check_replaceable(output, directory=True, owned=owned)
    st, settings = build_cross_encoder_st(ce_dir)
    name = model_name or f"dpr-cross-encoder-{output.name}"
    with atomic_path(output, owned=owned) as tmp:
        st.save(str(tmp), create_model_card=False)
        write_marker(tmp, ce_dir, "cross-encoder")
        (tmp / "README.md").write_text(_card(resolve_dir(ce_dir), settings, name), encoding="utf-8")
    log.info("exported cross-encoder %s as sentence-transformers to %s", ce_dir, output)
    return output


def compare_cross_encoder_export(ce_dir: str | Path, export_dir: str | Path, questions: Sequence[str],
                                 passages: Sequence[tuple[str, str]], batch_size: int = 32) -> dict[str, Any]:
    """Score every (question, (title, text)) pair with our scoring (fp32) and with ``CrossEncoder(export_dir)``;
    the largest absolute difference and whether each question's passages come out in the same order."""
    import numpy as np
    from sentence_transformers import CrossEncoder

    from dpr.rerank.model import document_text, load_cross_encoder
    from dpr.rerank.score import score_pairs

    model, tok, settings = load_cross_encoder(ce_dir)
    docs = [document_text(t, x, tok, bool(settings["title"])) for t, x in passages]
    qs = [q for q in questions for _ in docs]
    ds = [d for _ in questions for d in docs]
    ours = score_pairs(model, tok, qs, ds, batch_size=batch_size, autocast="fp32",
                       max_length=int(settings["max_length"])).numpy().reshape(len(questions), len(docs))
    st = CrossEncoder(str(export_dir), device="cpu", local_files_only=True)
    theirs = np.asarray(st.predict(list(zip(qs, ds)), batch_size=batch_size, show_progress_bar=False),
                        dtype=np.float32).reshape(len(questions), len(docs))
    same_order = int((np.argsort(-ours, axis=1, kind="stable") == np.argsort(-theirs, axis=1, kind="stable")).all(1).sum())
    return {"questions": len(questions), "passages": len(docs), "max_abs_diff": float(np.abs(ours - theirs).max()),
            "same_order": same_order}
