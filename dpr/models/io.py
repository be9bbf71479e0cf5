"""Building, saving and loading bi-encoders, and safetensors weight round trips for checkpoints.

A saved bi-encoder directory::

    out_dir/
      question_encoder/       HF save_pretrained (safetensors) + tokenizer: AutoModel/AutoTokenizer load it
      passage_encoder/        the same for the passage tower (a copy of the question tower when shared)
      projection.safetensors  only with a projection: question.{weight,bias} [, passage.{weight,bias}]
      biencoder.json          {"format": "dpr.biencoder", "version": 1, "config": BiEncoderConfig}

Each item is written aside and renamed into place; ``biencoder.json`` is removed first and
written last, so a directory is a loadable run only once every part is complete.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from dpr.atomic import atomic_path, write_json_atomic
from dpr.errors import DataError
from dpr.models.biencoder import BiEncoder, BiEncoderConfig
from dpr.models.hub import resolve_model_name
from dpr.models.pooling import detect_pooling

log = logging.getLogger(__name__)

CONFIG_FILE = "biencoder.json"
PROJECTION_FILE = "projection.safetensors"
QUESTION_DIR = "question_encoder"
PASSAGE_DIR = "passage_encoder"
FORMAT = "dpr.biencoder"
FORMAT_VERSION = 1
# Settings that change how inputs are cut or how scores are scaled, not what the trained weights
# compute (temperature rescales scores without changing any ranking).
_RUNTIME_KEYS = {"question_max_length", "passage_max_length", "temperature", "attn_implementation"}


def _unwrap(model: nn.Module) -> nn.Module:
    """The BiEncoder inside a DistributedDataParallel (or similar ``.module``) wrapper."""
    while not isinstance(model, BiEncoder) and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


def _load_encoder(path: str | Path, attn_implementation: str = "auto") -> nn.Module:
    """An HF encoder in float32 (transformers 5 would otherwise keep a half-precision checkpoint's dtype)."""
    import transformers
    from transformers import AutoModel

    key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    attn = {} if attn_implementation == "auto" else {"attn_implementation": attn_implementation}
    return AutoModel.from_pretrained(str(path), **attn, **{key: torch.float32})


def _load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def build_biencoder(cfg: BiEncoderConfig) -> tuple[BiEncoder, Any]:
    """An untrained bi-encoder from ``cfg.name`` (alias, HF name or path) and its tokenizer.

    Separate towers start as two copies of the same pretrained weights. A projection is
    initialised from torch's global RNG: seed before calling for reproducible runs. Returned in
    eval mode (like ``from_pretrained``); call ``.train()`` to fine-tune.
    """
    path = resolve_model_name(cfg.name)
    question = _load_encoder(path, cfg.attn_implementation)
    passage = None if cfg.shared else copy.deepcopy(question)
    model = BiEncoder(cfg, question, passage)
    model.eval()
    return model, _load_tokenizer(path)


def save_biencoder(model: nn.Module, tokenizer: Any, out_dir: str | Path) -> Path:
    """Write ``model`` (a BiEncoder, possibly DDP-wrapped) and ``tokenizer`` to ``out_dir`` (layout above).

    Under DDP call it on the main rank only. Other files already in ``out_dir`` are left alone.
    """
    model = _unwrap(model)
    if not isinstance(model, BiEncoder):
        raise TypeError(f"save_biencoder needs a BiEncoder, got {type(model).__name__}")
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

    write_json_atomic(out / CONFIG_FILE, {"format": FORMAT, "version": FORMAT_VERSION, "config": model.config.to_dict()})
    log.info("saved bi-encoder to %s", out)
    return out


def is_biencoder_dir(path: str | Path) -> bool:
    """True for a directory written by :func:`save_biencoder`."""
    return (Path(path) / CONFIG_FILE).is_file()


def read_biencoder_config(path: str | Path) -> BiEncoderConfig:
    """The validated :class:`BiEncoderConfig` of a saved run directory."""
    cfg_path = Path(path) / CONFIG_FILE
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
        if key in _RUNTIME_KEYS:
            setattr(cfg, key, value)
        elif getattr(cfg, key, object()) != value:
            raise ValueError(
                f"{path}: trained with {key}={getattr(cfg, key, None)!r}; cannot load it with {key}={value!r}"
            )
    cfg = BiEncoderConfig.from_dict(cfg.to_dict())  # re-validate overridden values
    for sub in (QUESTION_DIR,) if cfg.shared else (QUESTION_DIR, PASSAGE_DIR):
        if not (path / sub / "config.json").is_file():
            raise FileNotFoundError(f"{path / sub}: missing tower (incomplete bi-encoder directory)")
    question = _load_encoder(path / QUESTION_DIR, cfg.attn_implementation)
    passage = None if cfg.shared else _load_encoder(path / PASSAGE_DIR, cfg.attn_implementation)
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
    return model, _load_tokenizer(path / QUESTION_DIR)


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
