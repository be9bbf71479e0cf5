"""How texts are encoded: the options `dpr.models.encode_texts` and `dpr.models.iter_encode_batches` share.

One object instead of the same eight keywords on both functions, so a caller that encodes several times (validation,
the corpus cache, passage export) builds it once and passes it whole. The functions still accept each option as a
keyword (``encode_texts(model, tok, texts, "passage", batch_size=8)``); keywords given beside an options object
override its fields (:meth:`EncodeOptions.merged`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch

    from dpr.models.token_cache import TokenTable


@dataclass(frozen=True)
class EncodeOptions:
    """The options of one encoding pass (checked by the function that encodes, before any work)."""

    # Texts per forward pass.
    batch_size: int = 64
    # Tokens kept per text; None: the model config's length for the tower.
    max_length: int | None = None
    # Where the tower runs (the model is moved there in place); None: where the model is.
    device: "torch.device | str | None" = None
    # Mixed precision as in `dpr.trainkit.precision.autocast_dtype` ("auto", "bf16", "off", None).
    autocast: str | None = "auto"
    # Show a tqdm bar.
    progress: bool = False
    # How texts are batched: "tokens" (by token count), "chars" (by characters) or "none" (input order).
    length_sort: str = "tokens"
    # Replaces the tower's forward, called with the tokenizer's tensors (e.g. an ONNX Runtime session); no autocast.
    runner: "Callable[..., torch.Tensor] | None" = None
    # The texts' token ids tokenised once (`dpr.models.token_cache`), made with this tower's max length and prefix.
    tokens: "TokenTable | None" = None

    def merged(self, **fields: Any) -> "EncodeOptions":
        """These options with ``fields`` (option names) replaced; TypeError naming an unknown option."""
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown encode option(s) {unknown}; the options are EncodeOptions' fields")
        return dataclasses.replace(self, **fields) if fields else self


def encode_options(options: EncodeOptions | None, fields: dict[str, Any]) -> EncodeOptions:
    """``options`` (defaults when None) with the keyword ``fields`` a caller passed beside it."""
    return (options or EncodeOptions()).merged(**fields)
