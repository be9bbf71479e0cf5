"""LoRA on the cross-encoder (``rerank.model.lora``): adapters through peft (`dpr.models.lora`, the dual encoder's),
the new weights trained whole, the base frozen and never copied.

- :func:`add_adapters`: the one-label model wrapped by peft for sequence classification; the modules the base's
  checkpoint lacked (the new head: BERT's ``classifier``, a decoder's ``score``; a pooler the checkpoint did not
  have) train whole as peft's ``modules_to_save`` and get no adapters, everything else is frozen. Its
  ``state_dict`` holds the adapters and those modules alone, so checkpoints and the best weights
  (`dpr.trainkit.checkpoint`) do too.
- The saved directory's ``encoder/`` holds peft's ``adapter_config.json`` + ``adapter_model.safetensors`` (adapters
  and head) and the tokenizer; ``cross_encoder.json`` adds ``lora`` (the settings) and ``base_fingerprint``
  (`dpr.models.lora.base_fingerprint`) beside ``base_model`` (:func:`saved_info`). :func:`load_adapted` puts them
  back on the base, refused in one line when the base's files are not the ones trained on.
- `dpr.rerank.model.plain_encoder_dir`: a plain Hugging Face copy with the adapters merged, for the
  sentence-transformers export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from dpr.errors import DataError
from dpr.models.lora import LoraSettings, apply_lora, base_fingerprint, load_adapters, state_dict_of_trained_only
from dpr.models.run_format import CROSS_ENCODER, ST_ACTIVATION

# peft's name for a sequence classifier (it adds the usual head names, "classifier" and "score", to modules_to_save)
TASK_TYPE = "SEQ_CLS"


def new_modules(missing_keys: Any) -> list[str]:
    """The modules owning the weights a checkpoint lacked (``from_pretrained``'s ``missing_keys``), sorted."""
    return sorted({key.rsplit(".", 1)[0] for key in missing_keys if "." in key})


def add_adapters(model: torch.nn.Module, settings: LoraSettings, fresh: list[str]) -> torch.nn.Module:
    """``model`` (a one-label sequence classifier) with fresh adapters from torch's global RNG; the ``fresh``
    modules (:func:`new_modules`) train whole and get no adapters, the rest of the base is frozen."""
    peft_model = apply_lora(model, settings, task_type=TASK_TYPE, modules_to_save=list(fresh) or None,
                            exclude_modules=list(fresh) or None)
    return state_dict_of_trained_only(peft_model)


def saved_info(base: str, settings: LoraSettings) -> dict:
    """What ``cross_encoder.json`` records of a LoRA cross-encoder on ``base`` besides its input settings."""
    import dataclasses

    from dpr.models.hub import resolve_model_name

    return {"lora": dataclasses.asdict(settings), "base_fingerprint": base_fingerprint(resolve_model_name(base))}


def is_adapted(settings: Mapping[str, Any]) -> bool:
    """Whether a saved cross-encoder's ``cross_encoder.json`` (its ``settings``) describes adapters on a base."""
    return settings.get("lora") is not None


def load_adapted(path: Path, encoder_dir: Path, settings: Mapping[str, Any]) -> torch.nn.Module:
    """The base ``settings["base_model"]`` with the adapters and head saved in ``encoder_dir`` (``path``: the
    cross-encoder directory, named in the refusal). A base whose files differ from the recorded fingerprint is
    refused in one line: adapters on another base score nonsense."""
    from transformers import AutoModelForSequenceClassification

    from dpr.models.hub import resolve_model_name

    base = settings.get("base_model")
    if not isinstance(base, str) or not base:
        raise DataError(path / CROSS_ENCODER.config_file, "LoRA adapters without the base model they go on", field="base_model")
    recorded, found = settings.get("base_fingerprint"), base_fingerprint(resolve_model_name(base))
    if recorded and found is None:  # the base was a local directory when the adapters were trained
        raise DataError(path / CROSS_ENCODER.config_file, f"the LoRA base {base!r} these adapters were trained on is "
                        "not there any more (moved or deleted): put it back at that path", field="base_model")
    if recorded and found and recorded != found:
        raise DataError(path / CROSS_ENCODER.config_file, f"the adapters were trained on another {base!r} (base fingerprint "
                        f"{recorded[:12]}, found {found[:12]})", field="base_fingerprint")
    # the head the base lacks and fresh adapters are drawn, then replaced by the saved ones: the caller's RNG stream
    # is left as it was (loading a model does not move a seeded run's draws)
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForSequenceClassification.from_pretrained(resolve_model_name(base), num_labels=1)
        model.config.sentence_transformers = {"activation_fn": ST_ACTIVATION}
        return load_adapters(model, encoder_dir, trainable=False)
