"""The reader: any Hugging Face encoder + a start/end head on every token + a relevance logit on
[CLS] (DPR's ``qa_classifier``), so it both extracts a span and ranks the passages it reads.

A saved reader is a directory: ``encoder/`` (the encoder and tokenizer in Hugging Face format),
``reader_head.safetensors`` (the two linear heads) and ``reader.json`` (windowing settings the
reader was trained with, reused at inference).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dpr.atomic import atomic_path
from dpr.models.run_format import READER, READER_HEADS

MASKED = -1e4  # logit of a token that cannot be an answer (question, title, special tokens, padding)
SETTINGS_KEYS = ("max_length", "stride", "max_question_length", "title")


class Reader(nn.Module):
    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        hidden = encoder.config.hidden_size
        self.qa_outputs = nn.Linear(hidden, 2)
        self.qa_classifier = nn.Linear(hidden, 1)
        for layer in (self.qa_outputs, self.qa_classifier):
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, passage_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(start_logits, end_logits)`` ``[n, seq]`` with non-passage tokens masked, and relevance ``[n]``."""
        kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
        start, end = self.qa_outputs(hidden).float().unbind(-1)
        start = start.masked_fill(~passage_mask, MASKED)
        end = end.masked_fill(~passage_mask, MASKED)
        relevance = self.qa_classifier(hidden[:, 0]).float().squeeze(-1)
        return start, end, relevance


def build_reader(name: str, attn_implementation: str | None = None) -> tuple[Reader, Any]:
    """A fresh reader on encoder ``name`` (the offline MiniLM alias, a hub name or a local dir)."""
    from transformers import AutoTokenizer

    from dpr.models.hub import resolve_model_name

    path = resolve_model_name(name)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation not in (None, "auto") else {}
    return Reader(_load_encoder(path, **kwargs)), AutoTokenizer.from_pretrained(path, use_fast=True)


def _load_encoder(path: str | Path, **kwargs: Any) -> nn.Module:
    # BERT's pooler is unused by the reader; leaving it out keeps it out of the optimizer and the files
    from transformers import AutoConfig, AutoModel

    if AutoConfig.from_pretrained(path).model_type == "bert":
        kwargs["add_pooling_layer"] = False
    return AutoModel.from_pretrained(path, **kwargs)


def save_reader(model: Reader, tokenizer: Any, out_dir: str | Path, settings: dict) -> Path:
    """Write the reader directory atomically (a killed save leaves the previous one intact)."""
    out_dir = Path(out_dir)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        model.encoder.save_pretrained(tmp / READER.encoder_dir)
        tokenizer.save_pretrained(tmp / READER.encoder_dir)
        heads = {f"qa_outputs.{k}": v for k, v in model.qa_outputs.state_dict().items()}
        heads.update({f"qa_classifier.{k}": v for k, v in model.qa_classifier.state_dict().items()})
        save_file({k: v.detach().contiguous().cpu() for k, v in heads.items()}, str(tmp / READER_HEADS))
        (tmp / READER.config_file).write_text(json.dumps({k: settings[k] for k in SETTINGS_KEYS}, indent=2), encoding="utf-8")
    return out_dir


def load_reader(path: str | Path, device: str | torch.device | None = None) -> tuple[Reader, Any, dict]:
    """``(model in eval mode, tokenizer, settings)`` from a directory :func:`save_reader` wrote, on ``device``
    (None / ``auto``: the one device rule, `dpr.distributed.device`)."""
    from transformers import AutoTokenizer

    from dpr.distributed import resolve_device

    device = resolve_device(device)

    path = READER.resolve(path)  # the reader directory, or a training output directory holding one
    model = Reader(_load_encoder(path / READER.encoder_dir))
    heads = load_file(str(path / READER_HEADS))
    model.qa_outputs.load_state_dict({k.split(".", 1)[1]: v for k, v in heads.items() if k.startswith("qa_outputs.")})
    model.qa_classifier.load_state_dict({k.split(".", 1)[1]: v for k, v in heads.items() if k.startswith("qa_classifier.")})
    settings = json.loads((path / READER.config_file).read_text(encoding="utf-8"))
    return model.to(device).eval(), AutoTokenizer.from_pretrained(path / READER.encoder_dir, use_fast=True), settings
