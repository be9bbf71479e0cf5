"""The cross-encoder: a Hugging Face ``AutoModelForSequenceClassification`` with one label, whose logit
is the relevance of a (question, passage) pair read as ``[CLS] question [SEP] title [SEP] passage [SEP]``.

That model class *is* what ``sentence_transformers.CrossEncoder`` loads, so the saved encoder directory
loads there as it is and scores match by construction (the export, `dpr.export.cross_encoder`, only adds
sentence-transformers' own config files and a model card).

A saved cross-encoder is a directory: ``encoder/`` (model with its one-logit head, and tokenizer, in
Hugging Face format: the head lives in the model's own ``model.safetensors``, which is what keeps it
loadable by sentence-transformers) and ``cross_encoder.json`` (the input settings it was trained with,
reused when scoring). With LoRA (``rerank.model.lora``) ``encoder/`` holds the adapters and the head alone, and
``cross_encoder.json`` names the base and its fingerprint (`dpr.rerank.adapters`).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from dpr.atomic import atomic_path
from dpr.models.lora import LoraSettings, is_lora, merged_copy
from dpr.models.run_format import CROSS_ENCODER, ST_ACTIVATION
from dpr.rerank.adapters import add_adapters, is_adapted, load_adapted, new_modules

# the directory's layout is dpr.models.run_format's (one place knows every model directory); these names stay
CONFIG_FILE, ENCODER_DIR, FINAL_DIR = CROSS_ENCODER.config_file, CROSS_ENCODER.encoder_dir, CROSS_ENCODER.final_dir
SETTINGS_KEYS = ("max_length", "title")
is_cross_encoder_dir = CROSS_ENCODER.is_dir
resolve_dir = CROSS_ENCODER.resolve


def build_cross_encoder(name: str, attn_implementation: str | None = None,
                        lora: LoraSettings | None = None) -> tuple[torch.nn.Module, Any]:
    """A fresh cross-encoder on encoder ``name`` (the offline MiniLM alias, a hub name or a local dir); with
    ``lora``, adapters on the frozen base and only they and the new head train (`dpr.rerank.adapters`).
    The head (and adapters) are initialised from torch's global RNG: seed it first for a reproducible start."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from dpr.models.hub import resolve_model_name

    path = resolve_model_name(name)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation not in (None, "auto") else {}
    if lora is None:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **kwargs)
    else:
        model, info = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, output_loading_info=True,
                                                                         **kwargs)
    model.config.sentence_transformers = {"activation_fn": ST_ACTIVATION}
    if lora is not None:
        model = add_adapters(model, lora, new_modules(info["missing_keys"]))
    return model, AutoTokenizer.from_pretrained(path, use_fast=True)


def save_cross_encoder(model: torch.nn.Module, tokenizer: Any, out_dir: str | Path, settings: Mapping[str, Any],
                       extra: Mapping[str, Any] | None = None) -> Path:
    """Write the cross-encoder directory atomically (a killed save leaves the previous one intact). A LoRA model
    (`build_cross_encoder` with ``lora``) writes its adapters and head; ``extra`` must then name its
    ``base_model`` and hold `dpr.rerank.adapters.saved_info`'s ``lora`` and ``base_fingerprint``."""
    out_dir = Path(out_dir)
    if is_lora(model) and not (extra or {}).get("lora"):
        raise ValueError("save_cross_encoder: a LoRA cross-encoder needs its base and settings in extra "
                         "(dpr.rerank.adapters.saved_info)")
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp / ENCODER_DIR)
        (tmp / ENCODER_DIR / "README.md").unlink(missing_ok=True)  # peft's card template, not ours
        # the trained maximum length travels with the tokenizer, so sentence-transformers truncates alike
        before, tokenizer.model_max_length = tokenizer.model_max_length, int(settings["max_length"])
        try:
            tokenizer.save_pretrained(tmp / ENCODER_DIR)
        finally:
            tokenizer.model_max_length = before
        body = {k: settings[k] for k in SETTINGS_KEYS}
        body.update(extra or {})
        (tmp / CONFIG_FILE).write_text(json.dumps(body, indent=2), encoding="utf-8")
    return out_dir


def load_cross_encoder(path: str | Path, device: str | torch.device | None = None) -> tuple[torch.nn.Module, Any, dict]:
    """``(model in eval mode, tokenizer, settings)`` from a directory :func:`save_cross_encoder` wrote
    (or a training output directory holding one), on ``device`` (None / ``auto``: the one device rule,
    `dpr.distributed.device`)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from dpr.distributed import resolve_device

    device = resolve_device(device)

    path = resolve_dir(path)
    settings = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    missing = [k for k in SETTINGS_KEYS if k not in settings]
    if missing:
        raise ValueError(f"{path / CONFIG_FILE}: missing {', '.join(missing)}")
    if is_adapted(settings):  # adapters + head on the recorded base
        model = load_adapted(path, path / ENCODER_DIR, settings)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(path / ENCODER_DIR)
    if model.config.num_labels != 1:
        raise ValueError(f"{path / ENCODER_DIR}: a cross-encoder has one label, this model has {model.config.num_labels}")
    return model.to(device).eval(), AutoTokenizer.from_pretrained(path / ENCODER_DIR, use_fast=True), settings


def document_text(title: str, text: str, tokenizer: Any, use_title: bool = True) -> str:
    """The pair's second segment: ``title [SEP] text`` (the tokenizer reads its own separator token
    in the string as that special token), or the text alone without a title."""
    if use_title and title:
        return f"{title} {tokenizer.sep_token} {text}"
    return text


def tokenize_pairs(tokenizer: Any, questions: list[str], documents: list[str], max_length: int,
                   padding: bool = True) -> dict:
    """``[CLS] question [SEP] document [SEP]``, truncated as sentence-transformers' CrossEncoder does
    (longest segment first), so an exported model sees the same tokens."""
    return dict(tokenizer(questions, documents, truncation=True, max_length=max_length,
                          padding="longest" if padding else False, return_tensors="pt" if padding else None))


@contextlib.contextmanager
def plain_encoder_dir(ce_dir: str | Path) -> Iterator[Path]:
    """A Hugging Face directory of the cross-encoder ``ce_dir`` that loads without peft: its ``encoder/`` as it is,
    or, for adapters, a temporary copy with them merged into the base's weights (`dpr.models.lora.merged_copy`),
    removed on exit."""
    ce_dir = resolve_dir(ce_dir)
    settings = json.loads((ce_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    if not is_adapted(settings):
        yield ce_dir / ENCODER_DIR
        return
    model, tokenizer, _ = load_cross_encoder(ce_dir)  # the device rule's device: saving moves nothing
    with tempfile.TemporaryDirectory(prefix="dpr-merged-ce-") as tmp:
        merged_copy(model).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)  # as saved: with the trained maximum length
        yield Path(tmp)
