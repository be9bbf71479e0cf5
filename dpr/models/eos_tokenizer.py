"""A tokenizer that ends every input with exactly one EOS token (``pooling: eos``, as RepLLaMA and e5-mistral).

Decoder tokenizers (Llama, Qwen2, Mistral) do not append EOS by themselves, and some do: the wrapper cuts each
input one token short of ``max_length`` and appends EOS unless the row already ends with it, so every row ends
in one EOS, never two. Everything else (``pad``, ``save_pretrained``, the vocabulary) is the wrapped tokenizer's,
so the callers that tokenise (`dpr.models.inference`, the token cache) need no change.
"""

from __future__ import annotations

from typing import Any


class EosTokenizer:
    """``tokenizer`` with EOS appended to every input (the pooled position of ``pooling: eos``)."""

    def __init__(self, tokenizer: Any) -> None:
        if getattr(tokenizer, "eos_token_id", None) is None:
            raise ValueError(f"pooling=eos needs a tokenizer with an EOS token; {type(tokenizer).__name__} has none "
                             "(set tokenizer.eos_token, or use pooling=last)")
        self.tokenizer = tokenizer

    def __getattr__(self, name: str) -> Any:  # everything but __call__ is the wrapped tokenizer's
        return getattr(self.tokenizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "tokenizer":
            object.__setattr__(self, name, value)
        else:  # e.g. padding_side: set on the tokenizer that pads
            setattr(self.tokenizer, name, value)

    def __call__(self, text: Any, text_pair: Any = None, *, padding: Any = False, truncation: Any = None,
                 max_length: int | None = None, return_tensors: str | None = None, **kw: Any) -> Any:
        single = isinstance(text, str)
        cut = max_length - 1 if truncation and max_length else max_length
        enc = self.tokenizer(text, text_pair, truncation=truncation, max_length=cut, **kw)
        rows = [dict(zip(enc.keys(), values)) for values in zip(*enc.values())] if not single else [dict(enc)]
        eos = self.tokenizer.eos_token_id
        for row in rows:
            if row["input_ids"] and row["input_ids"][-1] == eos:
                continue  # the tokenizer's own template ended it with EOS: not twice
            row["input_ids"] = [*row["input_ids"], eos]
            for key in row:
                if key == "attention_mask":
                    row[key] = [*row[key], 1]
                elif key == "token_type_ids":
                    row[key] = [*row[key], row[key][-1] if row[key] else 0]
                elif key == "special_tokens_mask":
                    row[key] = [*row[key], 1]
        if single and not padding and return_tensors is None:
            return rows[0]
        if padding or return_tensors is not None:
            return self.tokenizer.pad(rows, padding=padding or "longest", return_tensors=return_tensors)
        return {key: [row[key] for row in rows] for key in rows[0]} if rows else {}

    def __repr__(self) -> str:
        return f"EosTokenizer({self.tokenizer!r})"
