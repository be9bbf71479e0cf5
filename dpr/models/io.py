"""Building, saving and loading bi-encoders, and safetensors weight round trips for checkpoints.

The directory layout is `dpr.models.run_format`'s (documented there). Each item is written aside and renamed
into place; ``biencoder.json`` is removed first and written last, so a directory is a loadable run only once
every part is complete. The towers are any Hugging Face backbone (`dpr.models.backbone`), optionally with LoRA
adapters (`dpr.models.lora`).
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from dpr.atomic import atomic_path, write_json_atomic
from dpr.errors import DataError
from dpr.models.backbone import load_tokenizer, load_tower
from dpr.models.biencoder import BiEncoder, BiEncoderConfig
from dpr.models.hub import resolve_model_name
from dpr.models.lora import LoraSettings, apply_lora, base_fingerprint, load_adapters
from dpr.models.pooling import check_pooling, detect_pooling
from dpr.models.protocol import find_encoder, is_encoder
from dpr.models.run_format import (
    CONFIG_FILE,
    FORMAT,
    FORMAT_VERSION,
    PASSAGE_DIR,
    PROJECTION_FILE,
    QUESTION_DIR,
    is_run_dir,
    model_marker,
)

log = logging.getLogger(__name__)

__all__ = ["CONFIG_FILE", "PASSAGE_DIR", "PROJECTION_FILE", "QUESTION_DIR", "build_biencoder", "is_biencoder_dir",
           "load_biencoder", "load_weights", "read_biencoder_config", "save_biencoder", "save_weights"]
# Settings that change how inputs are cut or how scores are scaled, not what the trained weights
# compute (temperature rescales scores without changing any ranking).
# The backbone's weights dtype, checkpointing and padding side change memory and speed, not the vectors' meaning.
_RUNTIME_KEYS = {"question_max_length", "passage_max_length", "temperature", "attn_implementation", "dtype",
                 "gradient_checkpointing", "padding_side"}


_unwrap = find_encoder  # the model inside a DistributedDataParallel (or similar ``.module``) wrapper
_FINGERPRINTS: dict[tuple[str, float], str | None] = {}


def _load_encoder(path: str | Path, cfg: BiEncoderConfig) -> nn.Module:
    return load_tower(path, cfg.attn_implementation, cfg.dtype, cfg.gradient_checkpointing)


def _fingerprint(base: str) -> str | None:
    """:func:`dpr.models.lora.base_fingerprint` of the base ``base`` resolves to, hashed once per process."""
    path = Path(resolve_model_name(base))
    key = (str(path), path.stat().st_mtime if path.exists() else 0.0)
    if key not in _FINGERPRINTS:
        _FINGERPRINTS[key] = base_fingerprint(path)
    return _FINGERPRINTS[key]


def build_biencoder(cfg: BiEncoderConfig) -> tuple[BiEncoder, Any]:
    """An untrained bi-encoder from ``cfg.name`` (alias, HF name or path) and its tokenizer.

    Separate towers start as two copies of the same pretrained weights. A projection is
    initialised from torch's global RNG: seed before calling for reproducible runs. Returned in
    eval mode (like ``from_pretrained``); call ``.train()`` to fine-tune.
    """
    path = resolve_model_name(cfg.name)
    question = _load_encoder(path, cfg)
    passage = None if cfg.shared else copy.deepcopy(question)
    if cfg.lora is not None:  # adapters drawn from torch's global RNG, question tower first
        question = apply_lora(question, cfg.lora)
        passage = None if passage is None else apply_lora(passage, cfg.lora)
    model = BiEncoder(cfg, question, passage)
    check_pooling(cfg.pooling, model.decoder, cfg.padding_side)  # vectors that could not tell texts apart
    model.eval()
    return model, load_tokenizer(path, cfg.pooling, cfg.padding_side, decoder=model.decoder)


def save_biencoder(model: nn.Module, tokenizer: Any, out_dir: str | Path) -> Path:
    """Write ``model`` (a BiEncoder, possibly DDP-wrapped) and ``tokenizer`` to ``out_dir`` (layout above).

    Under DDP call it on the main rank only. Other files already in ``out_dir`` are left alone.
    """
    model = _unwrap(model)
    if not is_encoder(model):
        raise TypeError(f"save_biencoder needs a dense encoder (dpr.models.DenseEncoder), got {type(model).__name__}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Invalidate first: an interrupted overwrite must not look like a complete model.
    (out / CONFIG_FILE).unlink(missing_ok=True)

    for sub, encoder in ((QUESTION_DIR, model.question_encoder), (PASSAGE_DIR, model.passage_encoder)):
        with atomic_path(out / sub) as tmp:
            encoder.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))

    if model.question_projection is not None:
        tensors = {f"question.{k}": v for k, v in model.question_projection.state_dict().items()}
        if not model.config.shared:
            tensors.update({f"passage.{k}": v for k, v in model.passage_projection.state_dict().items()})
        with atomic_path(out / PROJECTION_FILE) as tmp:
            save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp))
    else:
        (out / PROJECTION_FILE).unlink(missing_ok=True)

    doc = {"format": FORMAT, "version": FORMAT_VERSION, "config": model.config.to_dict()}
    if model.config.lora is not None:  # the towers hold adapters only: record which base they go on
        doc["base_fingerprint"] = _fingerprint(model.config.name)
    write_json_atomic(model_marker(out), doc)
    log.info("saved bi-encoder to %s", out)
    return out


def is_biencoder_dir(path: str | Path) -> bool:
    """True for a directory written by :func:`save_biencoder`."""
    return is_run_dir(path)


def read_biencoder_config(path: str | Path) -> BiEncoderConfig:
    """The validated :class:`BiEncoderConfig` of a saved run directory."""
    cfg_path = model_marker(path)
    try:
        doc = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(cfg_path, f"invalid JSON: {err.msg}", line=err.lineno) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DataError(cfg_path, f"not a {FORMAT} file", field="format")
    if doc.get("version") != FORMAT_VERSION:
        raise DataError(cfg_path, f"unsupported version {doc.get('version')!r} (expected {FORMAT_VERSION})", field="version")
    if not isinstance(doc.get("config"), dict):
        raise DataError(cfg_path, "missing or not an object", field="config")
    try:
        return BiEncoderConfig.from_dict(doc["config"])
    except (TypeError, ValueError) as err:
        raise DataError(cfg_path, str(err), field="config") from None


def _load_saved(path: Path, overrides: dict[str, Any]) -> tuple[BiEncoder, Any]:
    cfg = read_biencoder_config(path)
    for key, value in overrides.items():
        if key == "name":
            continue  # the saved name records the base model; the weights come from `path`
        if key == "lora":
            value = LoraSettings.coerce(value)
        if key in _RUNTIME_KEYS:
            setattr(cfg, key, value)
        elif getattr(cfg, key, object()) != value:
            raise ValueError(
                f"{path}: trained with {key}={getattr(cfg, key, None)!r}; cannot load it with {key}={value!r}"
            )
    cfg = BiEncoderConfig.from_dict(cfg.to_dict())  # re-validate overridden values
    marker = "adapter_config.json" if cfg.lora is not None else "config.json"
    for sub in (QUESTION_DIR,) if cfg.shared else (QUESTION_DIR, PASSAGE_DIR):
        if not (path / sub / marker).is_file():
            raise FileNotFoundError(f"{path / sub}: missing tower (incomplete bi-encoder directory)")
    if cfg.lora is not None:
        question, passage = _load_adapted(path, cfg)
    else:
        question = _load_encoder(path / QUESTION_DIR, cfg)
        passage = None if cfg.shared else _load_encoder(path / PASSAGE_DIR, cfg)
    model = BiEncoder(cfg, question, passage)
    if cfg.projection_dim:
        proj_path = path / PROJECTION_FILE
        if not proj_path.is_file():
            raise FileNotFoundError(f"{proj_path}: missing (config has projection_dim={cfg.projection_dim})")
        tensors = load_file(str(proj_path))
        towers = [("question", model.question_projection)]
        if not cfg.shared:
            towers.append(("passage", model.passage_projection))
        for prefix, layer in towers:
            state = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith(prefix + ".")}
            try:
                layer.load_state_dict(state)
            except RuntimeError as err:
                raise DataError(proj_path, str(err).splitlines()[0], field=prefix) from None
    model.eval()
    return model, load_tokenizer(path / QUESTION_DIR, cfg.pooling, cfg.padding_side, decoder=model.decoder)


def _load_adapted(path: Path, cfg: BiEncoderConfig) -> tuple[nn.Module, nn.Module | None]:
    """The towers of a LoRA run: the base model ``cfg.name`` (checked against the recorded fingerprint) with each
    tower's saved adapters."""
    recorded = json.loads(model_marker(path).read_text(encoding="utf-8")).get("base_fingerprint")
    found = _fingerprint(cfg.name)
    if recorded and found is None:  # the base was a local directory when the adapters were trained
        raise DataError(model_marker(path), f"the LoRA base {cfg.name!r} these adapters were trained on is not "
                        "there any more (moved or deleted): put it back at that path", field="config.name")
    if recorded and found and recorded != found:
        raise DataError(model_marker(path), f"the adapters were trained on another {cfg.name!r} (base fingerprint "
                        f"{recorded[:12]}, found {found[:12]})", field="base_fingerprint")
    base = _load_encoder(resolve_model_name(cfg.name), cfg)
    passage = None if cfg.shared else load_adapters(copy.deepcopy(base), path / PASSAGE_DIR)
    return load_adapters(base, path / QUESTION_DIR), passage


def load_biencoder(path_or_name: str | Path, **overrides: Any) -> tuple[BiEncoder, Any]:
    """Load a trained run directory, or build an untrained bi-encoder from any HF name/path.

    A directory with ``biencoder.json`` loads the saved towers, projection and config;
    ``overrides`` may change the max lengths and the temperature; any other key must match the
    saved value (a trained model cannot switch pooling or towers).
    Anything else (the alias ``all-MiniLM-L6-v2``, a hub name, a plain HF model directory) builds
    ``BiEncoderConfig(name=path_or_name, **overrides)``; without an explicit ``pooling`` it is
    "mean" for sentence-transformers models that mean-pool (read from ``1_Pooling/config.json``)
    and "cls" otherwise (DPR). Overrides set to None are ignored (unset Hydra keys).
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    path = Path(path_or_name)
    if is_biencoder_dir(path):
        return _load_saved(path, overrides)
    name = str(path_or_name)
    if "name" in overrides and overrides.pop("name") != name:
        raise ValueError(f"load_biencoder({name!r}) got a conflicting name override")
    if "pooling" not in overrides:
        overrides["pooling"] = detect_pooling(resolve_model_name(name)) or "cls"
    return build_biencoder(BiEncoderConfig(name=name, **overrides))


def save_weights(model: nn.Module, path: str | Path) -> None:
    """All of ``model``'s parameters and buffers to one safetensors file (atomically), for checkpoints."""
    with atomic_path(path) as tmp:
        save_model(_unwrap(model), str(tmp))


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load :func:`save_weights` output into ``model`` in place (strict: every key must match)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such weights file")
    try:
        load_model(_unwrap(model), str(path), strict=True, device=str(next(model.parameters()).device))
    except RuntimeError as err:
        raise DataError(path, f"weights do not match the model: {' '.join(str(err).split())[:300]}") from None
