"""Freeze the bottom of a tower: its embeddings and first ``n`` transformer layers get no gradient.

Why: in a two-tower step the passage tower's backward pass is most of the cost (64 passages of up to
192 tokens against 32 short questions). With the bottom ``n`` layers frozen, autograd records nothing
below layer ``n`` (their inputs and weights need no gradient), so the backward pass stops there and
a step costs roughly ``n / num_layers`` of the passage backward less. Lower layers of a pre-trained
encoder carry general lexical features that fine-tuning on a few thousand questions changes little;
the top layers adapt the representation (the same reasoning as ULMFiT's and many retrievers'
partial fine-tuning).
"""

from __future__ import annotations

from torch import nn


def transformer_layers(encoder: nn.Module) -> nn.ModuleList:
    """The encoder's stack of transformer layers: the first ``nn.ModuleList`` (in module order) with
    ``config.num_hidden_layers`` entries (BERT's ``encoder.layer``, DistilBERT's ``transformer.layer``, ...)."""
    n = getattr(getattr(encoder, "config", None), "num_hidden_layers", None)
    for module in encoder.modules():
        if isinstance(module, nn.ModuleList) and n is not None and len(module) == n:
            return module
    raise ValueError(f"{type(encoder).__name__}: no list of {n} transformer layers found to freeze")


def freeze_bottom_layers(encoder: nn.Module, n: int) -> int:
    """Freeze the embeddings and the first ``n`` transformer layers of ``encoder`` (in place).

    ``n = 0`` changes nothing. Returns how many parameters were frozen. ``n`` beyond the number of
    layers is an error: a fully frozen tower is the frozen-index training (``train.frozen_steps``).
    """
    if n <= 0:
        return 0
    layers = transformer_layers(encoder)
    if n > len(layers):
        raise ValueError(f"cannot freeze {n} layers of a {len(layers)}-layer encoder "
                         "(to keep a whole tower fixed, use train.frozen_steps)")
    embeddings = getattr(encoder, "embeddings", None)
    if not isinstance(embeddings, nn.Module):
        embeddings = encoder.get_input_embeddings()
    frozen = 0
    for module in [embeddings, *layers[:n]]:
        for param in module.parameters():
            if param.requires_grad:
                param.requires_grad_(False)
                frozen += param.numel()
    return frozen
