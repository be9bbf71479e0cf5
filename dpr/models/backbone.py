"""Any Hugging Face backbone as a tower: encoders (BERT, MiniLM, e5) and decoder-only LLMs (Llama, Qwen2, Mistral).

What differs between the two families is settled here, once:

- **weights dtype** (``model.dtype``): ``fp32`` (the default; transformers 5 would otherwise keep a half-precision
  checkpoint's dtype) or ``bf16`` (half the memory: two 7B towers in fp32 need ~56 GB). Training in bf16 weights
  is for LoRA only (`check_trainable_dtype`): the optimizer would add its updates to bf16 weights, whose 8-bit
  mantissa rounds an update smaller than 1/256 of the weight away, so most weights would never change;
- **gradient checkpointing** (``model.gradient_checkpointing``): activations recomputed in the backward pass;
- **padding side** (``model.padding_side``): ``auto`` pads decoders on the left (the last real token sits at the
  end of every row) and leaves an encoder's tokenizer as it is; decoders get position ids from the attention
  mask (`position_ids`), so a left-padded row is encoded exactly as the same row unpadded;
- **EOS**: ``pooling: eos`` wraps the tokenizer so every input ends in one EOS (`dpr.models.eos_tokenizer`);
  a decoder tokenizer without a padding token pads with its EOS token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PADDING_SIDES = ("auto", "left", "right")
# model_type values of decoder-only families; any config whose architectures end in ForCausalLM counts too.
DECODER_TYPES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi",
                           "phi3", "gpt2", "gpt_neox", "opt", "falcon", "olmo", "olmo2", "stablelm", "starcoder2"})


def check_trainable_dtype(dtype: str, lora: Any, key: str = "model") -> None:
    """Refuse (ValueError, one line) training a whole model whose weights are bf16: AdamW's steps (lr x ~1) are far
    below half a bf16 ulp of most weights, so they round away and most weights never change. LoRA adapters are
    created in fp32 on a frozen bf16 base, so they train; fp32 weights train under bf16 autocast as well."""
    if dtype == "bf16" and not lora:
        raise ValueError(f"{key}.dtype=bf16 trains only LoRA adapters: with {key}.lora=null every weight is bf16 "
                         "and most of AdamW's updates round away (smaller than half a bf16 step of the weight); "
                         f"train with {key}.dtype=fp32 (precision=auto still computes in bf16 where the CPU/GPU "
                         f"has it) or set {key}.lora")


def is_decoder_config(config: Any) -> bool:
    """True for a decoder-only (causal LM) model configuration."""
    if getattr(config, "is_encoder_decoder", False):
        return False
    if getattr(config, "model_type", None) in DECODER_TYPES:
        return True
    return any(str(a).endswith("ForCausalLM") for a in (getattr(config, "architectures", None) or []))


def is_decoder_path(path: str | Path) -> bool:
    """:func:`is_decoder_config` of the model at ``path`` (its config.json alone is read)."""
    from transformers import AutoConfig

    return is_decoder_config(AutoConfig.from_pretrained(str(path)))


def check_attn_implementation(value: str, key: str = "model.attn_implementation") -> None:
    """Refuse (ValueError, one line) an attention implementation whose package is not installed, before
    transformers fails deep inside loading with its own advice."""
    import importlib.util

    needs = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}.get(value)
    if needs is not None and importlib.util.find_spec(needs) is None:
        raise ValueError(f"{key}={value} needs the {needs} package (pip install flash-attn, on a CUDA GPU it "
                         f"supports), which is not installed: use {key}=auto (SDPA) or sdpa")


def load_tower(path: str | Path, attn_implementation: str = "auto", dtype: str = "fp32",
               gradient_checkpointing: bool = False) -> nn.Module:
    """The backbone at ``path`` as a model that returns token states (``AutoModel``: a causal LM without its head)."""
    import transformers
    from transformers import AutoModel

    key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    check_attn_implementation(attn_implementation)
    attn = {} if attn_implementation == "auto" else {"attn_implementation": attn_implementation}
    model = AutoModel.from_pretrained(str(path), **attn, **{key: DTYPES[dtype]})
    if gradient_checkpointing:
        # non-reentrant: works with frozen inputs (LoRA) and with the towers' no-grad passes
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def load_tokenizer(path: str | Path, pooling: str = "mean", padding_side: str = "auto",
                   decoder: bool | None = None) -> Any:
    """The tokenizer at ``path``, set up for the pooling and the backbone family (see the module docstring)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if decoder is None:
        decoder = padding_side == "auto" and is_decoder_path(path)
    side = ("left" if decoder else None) if padding_side == "auto" else padding_side
    if side is not None:
        tok.padding_side = side
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token  # LLM tokenizers have none; the attention mask hides it anyway
    if tok.pad_token is None:  # no batch of texts of different lengths could be built (training pads too)
        raise ValueError(f"{path}: the tokenizer has neither a padding nor an EOS token, so texts of different "
                         "lengths cannot be batched: give it one (tokenizer.add_special_tokens({'pad_token': ...}), "
                         "then save it there)")
    if pooling == "eos":
        from dpr.models.eos_tokenizer import EosTokenizer

        return EosTokenizer(tok)
    return tok


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only: 0 at each row's first real token, whichever side it is padded on."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
