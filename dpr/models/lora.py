"""LoRA adapters on a tower, through `peft`: only the adapters train; a run stores them, not the base.

``model.lora`` (`LoraSettings`) wraps each tower in a ``peft`` model whose base weights are frozen; the
run directory's tower folders then hold ``adapter_config.json`` + ``adapter_model.safetensors`` (and the
tokenizer), and ``biencoder.json`` names the base model (``config.name``) with its fingerprint
(`base_fingerprint`), checked when the run loads. Checkpoints hold the trainable weights alone
(`dpr.models.io.save_weights`). `merged_copy` folds the adapters into a plain Hugging Face model for exports.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from torch import nn

from dpr.config import Int, Real, check_fields, setting, strict_from_dict


@dataclass
class LoraSettings:
    """``model.lora``: rank, scale (``alpha / r`` multiplies the update), adapter dropout, and the module names the
    adapters go on (peft's ``target_modules``; ``all-linear`` for every linear layer but the output)."""

    r: int = setting(16, Int(0, 4096, note="0: no adapters"))  # the adapters' rank (0: off, as null is)
    alpha: float = setting(32.0, Real(0, 1e6, lo_open=True))  # alpha / r scales the update
    dropout: float = setting(0.05, Real(0, 1, hi_open=True))  # dropout on the adapters' input
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])  # module names, or all-linear

    def __post_init__(self) -> None:
        check_fields(self, "model.lora")
        self.r, self.alpha, self.dropout = int(self.r), float(self.alpha), float(self.dropout)
        if isinstance(self.target_modules, str):
            self.target_modules = [self.target_modules]
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise ValueError(f"model.lora.target_modules must be a non-empty list of module names, got "
                             f"{self.target_modules!r}")
        self.target_modules = [str(m) for m in self.target_modules]

    @classmethod
    def coerce(cls, value: "LoraSettings | Mapping[str, Any] | None",
               label: str = "model.lora") -> "LoraSettings | None":
        """``value`` as settings (None: no adapters, as null or ``r: 0`` say); ``label``: the key the messages name
        (the cross-encoder's is ``rerank.model.lora``)."""
        if value is None or isinstance(value, LoraSettings):
            return None if value is not None and value.r == 0 else value
        if not isinstance(value, Mapping):
            raise ValueError(f"{label} must be a mapping of {[f.name for f in dataclasses.fields(cls)]} or null, "
                             f"got {value!r}")
        try:
            settings = strict_from_dict(cls, dict(value), "model.lora")
            return None if settings.r == 0 else settings
        except ValueError as err:  # the checks name model.lora: say which key it was given as
            raise ValueError(str(err).replace("model.lora", label)) from None

    def peft_config(self, **extra: Any) -> Any:
        """peft's ``LoraConfig``; ``extra``: more of its keys (the cross-encoder's ``task_type``,
        ``modules_to_save``, ``exclude_modules``)."""
        from peft import LoraConfig

        targets: Any = self.target_modules[0] if self.target_modules == ["all-linear"] else list(self.target_modules)
        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=targets,
                          bias="none", **extra)


def is_lora(module: nn.Module) -> bool:
    """True for a tower wrapped by peft."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(module, PeftModel)


def apply_lora(encoder: nn.Module, settings: LoraSettings, **extra: Any) -> nn.Module:
    """``encoder`` wrapped with fresh adapters (peft initialises B to zero: the vectors start as the base's);
    ``extra``: more LoraConfig keys (`LoraSettings.peft_config`)."""
    from peft import get_peft_model

    try:
        return get_peft_model(encoder, settings.peft_config(**extra))
    except ValueError as err:  # peft's words name its own arguments; say which setting and what exists
        if "not found in the base model" not in str(err) and "No modules were targeted" not in str(err):
            raise
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in encoder.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(f"lora.target_modules={list(settings.target_modules)}: no such module in "
                         f"{type(encoder).__name__}; its linear layers are named {', '.join(linear)}") from None


def load_adapters(encoder: nn.Module, adapter_dir: str | Path, trainable: bool = True) -> nn.Module:
    """``encoder`` (the base) with the adapters saved in ``adapter_dir``, trainable (for resuming or fine-tuning)
    unless ``trainable`` is false (scoring)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(encoder, str(adapter_dir), is_trainable=trainable)


def is_trained_key(key: str) -> bool:
    """A weight a peft model trains: an adapter's (``lora_*``) or a fully trained module's copy (peft's
    ``modules_to_save``, e.g. a classification head); the rest is the frozen base."""
    return ".lora_" in key or ".modules_to_save." in key


def state_dict_of_trained_only(model: nn.Module) -> nn.Module:
    """Make ``model`` (a peft model) save and load its trained weights alone (:func:`is_trained_key`): its
    ``state_dict`` leaves the frozen base out, and loading such a state dict does not count the base as missing.
    Checkpoints and best weights (safetensors' ``save_model`` / ``load_model``, `dpr.trainkit.checkpoint`) then
    hold the adapters and the head, not a copy of the base named by the run's config. Returns ``model``."""

    base = {k for k in model.state_dict() if not is_trained_key(k)}  # before the hook below leaves them out

    def drop_base(module: nn.Module, state: dict, prefix: str, local_metadata: Any) -> None:
        for key in [k for k in state if k.startswith(prefix) and not is_trained_key(k[len(prefix):])]:
            del state[key]

    def ours(key: str) -> bool:  # a base weight of this model, under whatever prefix it was loaded with
        parts = key.split(".")
        return any(".".join(parts[i:]) in base for i in range(len(parts)))

    def base_not_missing(module: nn.Module, incompatible: Any) -> None:
        for key in [k for k in incompatible.missing_keys if not is_trained_key(k) and ours(k)]:
            incompatible.missing_keys.remove(key)

    model.register_state_dict_post_hook(drop_base)
    model.register_load_state_dict_post_hook(base_not_missing)
    return model


def merged_copy(encoder: nn.Module) -> nn.Module:
    """A plain Hugging Face model with the adapters folded into its weights (``encoder`` itself untouched)."""
    if not is_lora(encoder):
        return encoder
    return copy.deepcopy(encoder).merge_and_unload()


def base_fingerprint(base_path: str | Path) -> str | None:
    """sha256 over a local base model's config and weight files (names and contents); None for a hub name that
    is not a local directory (nothing to compare against)."""
    root = Path(base_path)
    if not root.is_dir():
        return None
    from dpr.atomic import sha256_file

    h = hashlib.sha256()
    for path in sorted(p for p in root.iterdir() if p.is_file() and (p.name == "config.json" or p.suffix in (
            ".safetensors", ".bin"))):
        h.update(path.name.encode())
        h.update(sha256_file(path).encode())
    return h.hexdigest()
