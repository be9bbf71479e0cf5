"""The bi-encoder: a question tower and a passage tower over any Hugging Face encoder.

Vectors and similarity
----------------------
``encode_questions`` / ``encode_passages`` return float32 ``[B, D]``: pooled token states
(``cls`` or masked ``mean``), optionally through a linear projection. With
``similarity="cosine"`` they return L2-normalised vectors, so an inner-product FAISS index over
exported passage vectors ranks exactly as the model does; ``similarity(q, p)`` is then a dot
product divided by ``temperature`` (it normalises again, which is a no-op for encoder outputs and
makes it correct for vectors from elsewhere). With ``similarity="dot"`` vectors are raw and the
score is ``q . p / temperature``.

Towers are two independent copies of the same pretrained weights by default (DPR); with
``shared=True`` one encoder (and one projection) serves both, stored once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from dpr.config import (Int, Real, check_fields, recorded_later, setting, strict_from_dict,
                        without_recorded_later)
from dpr.models.backbone import DTYPES, PADDING_SIDES, is_decoder_config, position_ids
from dpr.models.length_buckets import encode_bucketed
from dpr.models.lora import LoraSettings
from dpr.models.pooling import POOLING_MODES, pool

SIMILARITIES = ("dot", "cosine")
_INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class BiEncoderConfig:
    """Everything needed to rebuild a bi-encoder's architecture (saved as ``biencoder.json``).

    The prefixes and the backbone keys were added after runs were recorded: each field's ``recorded_before`` is the
    value those runs had, left out of what runs and pipeline stages record and compare while the key holds it
    (`without_empty_prefixes`), so earlier run directories stay up to date; biencoder.json always wrote the prefixes
    (``saved_always``)."""

    name: str = "all-MiniLM-L6-v2"  # a Hugging Face name or local directory (the offline alias of MiniLM by default)
    shared: bool = False  # one tower for questions and passages (false: two, both starting from the same weights)
    pooling: str = "mean"  # cls | mean | last | eos (eos: an EOS appended, then the last token; for decoders)
    # a linear layer after pooling to this size (its weights are saved with the run)
    projection_dim: int | None = setting(None, Int(1, 65536, optional=True, note="null: no projection"))
    similarity: str = "dot"  # dot | cosine: how a question vector scores a passage vector
    # scores are divided by it: below, fp32 scores overflow (1e-20: inf gradients, 1e-40: NaN loss); above,
    # every score rounds to the same value (1e300: all ties) -- no training signal, and nothing to rank
    temperature: float = setting(1.0, Real(1e-4, 1e4))
    question_max_length: int = setting(64, Int(1))  # tokens a question is truncated to
    passage_max_length: int = setting(256, Int(1))  # tokens a passage (title and text) is truncated to
    # auto: transformers' default (SDPA where the model supports it); or any HF value ("sdpa", "eager",
    # "flash_attention_2" on GPUs that have it). On the 2-core CPU, eager was 2x slower to encode.
    attn_implementation: str = "auto"
    # Text put before every question / passage (e5's "query: " / "passage: ", bge's query instruction):
    # the models that were pre-trained with them retrieve worse without. With a title, the passage prefix
    # goes before the title (the pair's first segment), as sentence-transformers applies its prompts.
    question_prefix: str = setting("", recorded_before="", saved_always=True)
    # text put before every passage (see question_prefix)
    passage_prefix: str = setting("", recorded_before="", saved_always=True)
    # the towers' weights: fp32 | bf16 (bf16 trains only with LoRA: docs/backbones.md)
    dtype: str = setting("fp32", recorded_before="fp32")
    # recompute activations in the backward pass: less memory, slower steps
    gradient_checkpointing: bool = setting(False, recorded_before=False)
    # auto: left for decoder-only backbones, the tokenizer's own otherwise
    padding_side: str = setting("auto", recorded_before="auto")
    # LoRA adapters on the towers (null: the whole tower trains): next section
    lora: LoraSettings | None = setting(None, recorded_before=None)

    def __post_init__(self) -> None:
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"model.pooling must be one of {POOLING_MODES}, got {self.pooling!r}")
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"model.similarity must be one of {SIMILARITIES}, got {self.similarity!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.padding_side not in PADDING_SIDES:
            raise ValueError(f"model.padding_side must be one of {PADDING_SIDES}, got {self.padding_side!r}")
        self.lora = LoraSettings.coerce(self.lora)
        check_fields(self, "model")  # types, finiteness and ranges of the numeric keys
        self.temperature = float(self.temperature)
        self.projection_dim = int(self.projection_dim) if self.projection_dim is not None else None
        self.question_max_length = int(self.question_max_length)
        self.passage_max_length = int(self.passage_max_length)
        self.shared = bool(self.shared)
        self.name = str(self.name)
        for key in ("question_prefix", "passage_prefix"):
            value = getattr(self, key)
            if value is None or not isinstance(value, str):
                raise ValueError(f"model.{key} must be a string (\"\" for none), got {value!r}")

    def prefix(self, tower: str) -> str:
        """The text put before every input of ``tower`` ("question" or "passage")."""
        return self.question_prefix if tower == "question" else self.passage_prefix

    def to_dict(self) -> dict[str, Any]:
        """The config as ``biencoder.json`` records it: the backbone keys left out while at their defaults, so a
        run made before they existed and one made now with the same settings write the same file."""
        return without_unset_backbone_keys(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BiEncoderConfig":
        """Build from a mapping (e.g. a Hydra ``model`` node); unknown keys are an error, not ignored."""
        return strict_from_dict(cls, d, "bi-encoder")


def without_empty_prefixes(model: Mapping[str, Any]) -> dict[str, Any]:
    """A ``model`` config as runs and pipeline stages compare it: the keys added after runs were recorded (empty
    prefixes, the backbone keys: `dpr.config.recorded_later`) left out while at the value those runs had, so run
    directories made before they existed stay up to date and unchanged."""
    return without_recorded_later(model, recorded_later(BiEncoderConfig))


def without_unset_backbone_keys(model: Mapping[str, Any]) -> dict[str, Any]:
    """``model`` without the backbone keys at their defaults (empty prefixes stay: biencoder.json always had them)."""
    return without_recorded_later(model, recorded_later(BiEncoderConfig, saved=True))


def _freeze_unused_pooler(encoder: nn.Module) -> None:
    """BERT-style models carry a pooler we never call (we pool token states ourselves).

    Its parameters would get no gradient, which DDP (without find_unused_parameters) reports as
    an error; freezing them keeps them out of the reducer while leaving the saved HF model intact.
    """
    pooler = getattr(encoder, "pooler", None)
    if isinstance(pooler, nn.Module):
        for param in pooler.parameters():
            param.requires_grad_(False)


class BiEncoder(nn.Module):
    """Question and passage towers with pooling, optional projection and a similarity function."""

    def __init__(
        self,
        config: BiEncoderConfig,
        question_encoder: nn.Module,
        passage_encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        if not config.shared and passage_encoder is None:
            raise ValueError("separate towers (shared=False) need a passage encoder")
        self.question_encoder = question_encoder
        self.question_projection = nn.Linear(self.hidden_size, config.projection_dim) if config.projection_dim else None
        # Shared towers are stored once, so state_dict has one entry per weight (safetensors refuses
        # aliased tensors). Separate towers are registered under the names the properties below
        # read; writing to _modules directly because the properties shadow plain attribute setting.
        if not config.shared:
            self._modules["passage_encoder"] = passage_encoder
            if config.projection_dim:
                self._modules["passage_projection"] = nn.Linear(self.hidden_size, config.projection_dim)
        for enc in {id(m): m for m in (self.question_encoder, self.passage_encoder)}.values():
            _freeze_unused_pooler(enc)
        # Decoders get positions counted over real tokens (left padding must not shift them); encoders are
        # called exactly as before.
        self.decoder = is_decoder_config(question_encoder.config)
        if config.lora is not None:
            # also when loaded through a wrapper (DDP, the trainer's): the frozen base's weights are not expected
            self.register_load_state_dict_post_hook(_base_weights_not_missing)

    def state_dict(self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False) -> Any:
        """All weights; with LoRA only the trained ones (adapters, projections): the frozen base is an input
        named by ``config.name``, so checkpoints and the best weights hold the adapters, not a copy of the base
        (safetensors' ``save_model`` / ``load_model`` go through this)."""
        out = super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        if self.config.lora is not None:
            for key in [k for k in out if k.startswith(prefix) and not _trained_key(k[len(prefix):])]:
                del out[key]
        return out
    # The passage tower is the question tower when shared; these properties hide the difference.
    @property
    def passage_encoder(self) -> nn.Module:
        return self.question_encoder if self.config.shared else self._modules["passage_encoder"]

    @property
    def passage_projection(self) -> nn.Linear | None:
        if self.config.shared:
            return self.question_projection
        return self._modules.get("passage_projection")

    @property
    def hidden_size(self) -> int:
        return int(self.question_encoder.config.hidden_size)

    @property
    def dim(self) -> int:
        """Dimension of the output vectors."""
        return self.config.projection_dim or self.hidden_size

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def _encode(
        self,
        encoder: nn.Module,
        projection: nn.Linear | None,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None,
    ) -> torch.Tensor:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None and not self.decoder:  # decoders have no segment embeddings
            kwargs["token_type_ids"] = token_type_ids
        if self.decoder:
            kwargs["position_ids"] = position_ids(attention_mask)
        out = encoder(**kwargs)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        # Pool in fp32: summing many bf16 token states loses precision.
        vec = pool(hidden.float(), attention_mask, self.config.pooling)
        if projection is not None:
            vec = projection(vec)
        vec = vec.float()
        if self.config.similarity == "cosine":
            vec = F.normalize(vec, p=2, dim=-1)
        return vec

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B, L, H]`` token states -> ``[B, H]`` by the configured pooling (fp32)."""
        return pool(hidden.float(), attention_mask, self.config.pooling)

    def encode_questions(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B, L]`` token ids -> ``[B, D]`` float32 (L2-normalised for cosine similarity)."""
        return self._encode(self.question_encoder, self.question_projection, input_ids, attention_mask, token_type_ids)

    def encode_passages(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[N, L]`` token ids -> ``[N, D]`` float32 (L2-normalised for cosine similarity)."""
        return self._encode(self.passage_encoder, self.passage_projection, input_ids, attention_mask, token_type_ids)

    def similarity(self, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """``[B, D] x [N, D] -> [B, N]`` scores: dot or cosine, divided by the temperature."""
        if self.config.similarity == "cosine":
            q = F.normalize(q, p=2, dim=-1)
            p = F.normalize(p, p=2, dim=-1)
        return (q @ p.transpose(0, 1)) / self.config.temperature

    def forward(
        self, q_inputs: Mapping[str, torch.Tensor] | None = None, p_inputs: Mapping[str, torch.Tensor] | None = None,
        bucket_size: int = 0,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Encode either or both batches (dicts of tokenizer outputs; extra keys are ignored).

        One ``forward`` for both towers so a DistributedDataParallel wrapper sees every parameter
        used in a single call; either side may be None (the gradient cache encodes chunks).
        ``bucket_size > 0`` encodes each side in length-sorted buckets of that many rows
        (:func:`dpr.models.length_buckets.encode_bucketed`: same vectors, fewer padded tokens).
        """
        q = encode_bucketed(self.encode_questions, _select(q_inputs), bucket_size) if q_inputs is not None else None
        p = encode_bucketed(self.encode_passages, _select(p_inputs), bucket_size) if p_inputs is not None else None
        return q, p


def _trained_key(key: str) -> bool:
    """A LoRA bi-encoder's own weights: its adapters (peft names them ``lora_*``) and projections."""
    return ".lora_" in key or key.split(".", 1)[0] in ("question_projection", "passage_projection")


def _base_weights_not_missing(module: nn.Module, incompatible: Any) -> None:
    """A LoRA bi-encoder's load_state_dict hook: the frozen base's weights are not missing (see ``state_dict``)."""
    for key in [k for k in incompatible.missing_keys if ".lora_" not in k and "_projection." not in k
                and ("question_encoder." in k or "passage_encoder." in k)]:
        incompatible.missing_keys.remove(key)


def _select(inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: inputs[k] for k in _INPUT_KEYS if k in inputs and inputs[k] is not None}
