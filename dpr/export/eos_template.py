"""``pooling: eos`` in a sentence-transformers export: the tower's tokenizer given a post-processing template that
ends every input with its EOS token, as `dpr.models.eos_tokenizer.EosTokenizer` does when dpr encodes, so that
sentence-transformers' own tokenisation and its last-token pooling see the same ids.

The template extends the tokenizer's own (Llama's BOS, BERT's CLS/SEP; a ByteLevel post-processor, as Qwen2's,
only trims offsets and is replaced). The copy is saved as a plain ``PreTrainedTokenizerFast``: a model-specific class
would rebuild its template from its settings on load and drop the EOS. Before it is used, its ids are compared with
``EosTokenizer``'s on probe texts (short, truncated at the tower's lengths, a padded batch, alone and as pairs): any
difference is one ValueError, and the export writes nothing.
"""

from __future__ import annotations

import json
from typing import Any

PROBES = ["who wrote hamlet", "Paris is the capital of France. " * 40, "x", "a b c d e f g"]
PAIRS = ["Hamlet", "France", "a title that runs on " * 20, ""]  # passages as (title, text), DPR's input


def _sequence_items(items: list[dict]) -> list[str]:
    out = []
    for item in items:
        if "SpecialToken" in item:
            out.append(f"{item['SpecialToken']['id']}:{item['SpecialToken']['type_id']}")
        else:
            out.append(f"${item['Sequence']['id']}:{item['Sequence']['type_id']}")
    return out


def _template(state: dict | None) -> tuple[list[str], list[str], list[tuple[str, int]]] | None:
    """The post-processor's (single, pair, special tokens) as TemplateProcessing strings; None: not one to extend."""
    kind = (state or {}).get("type")
    if kind in (None, "ByteLevel"):
        return ["$A:0"], ["$A:0", "$B:1"], []
    if kind == "TemplateProcessing":
        special = [(name, spec["ids"][0]) for name, spec in state["special_tokens"].items() if len(spec["ids"]) == 1]
        if len(special) != len(state["special_tokens"]):
            return None  # a special token of several ids: not expressible here
        return _sequence_items(state["single"]), _sequence_items(state["pair"]), special
    if kind == "Sequence":
        parts = [p for p in state["processors"] if p.get("type") != "ByteLevel"]
        return _template(parts[0]) if len(parts) == 1 and parts[0].get("type") == "TemplateProcessing" else None
    return None


def with_eos_template(tokenizer: Any, lengths: list[int], where: str) -> Any:
    """A copy of ``tokenizer`` (a fast tokenizer) whose template ends every input with one EOS, checked against
    ``EosTokenizer`` at each of ``lengths`` (the tower's max lengths). ``where`` names the tower in errors."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    from dpr.models.eos_tokenizer import EosTokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    eos, eos_id = getattr(tokenizer, "eos_token", None), getattr(tokenizer, "eos_token_id", None)
    state = json.loads(backend.to_str())["post_processor"] if backend is not None else None
    template = _template(state) if backend is not None else None
    if template is None or eos_id is None:
        kind = (state or {}).get("type") if backend is not None else "slow"
        raise ValueError(f"{where}: pooling=eos needs the tokenizer's template to append EOS for "
                         f"sentence-transformers, and its post-processor ({kind}) is not one dpr can extend; "
                         "export a pooling=last run, or use the run with dpr")
    single, pair, special = template
    if single[-1] != f"{eos}:0":  # the tokenizer's own template already ends with EOS: EosTokenizer adds none
        single, pair = [*single, f"{eos}:0"], [*pair, f"{eos}:1"]
        special = [*[s for s in special if s[0] != eos], (eos, eos_id)]
    copy = Tokenizer.from_str(backend.to_str())  # the tower's own tokenizer stays as it is
    copy.post_processor = TemplateProcessing(single=" ".join(single), pair=" ".join(pair), special_tokens=special)
    specials = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
    out = PreTrainedTokenizerFast(tokenizer_object=copy, **specials, padding_side=tokenizer.padding_side,
                                  truncation_side=tokenizer.truncation_side,
                                  model_max_length=tokenizer.model_max_length)
    ours = EosTokenizer(tokenizer)
    for length, pairs in ((n, p) for n in lengths for p in (None, PAIRS)):
        a = ours(PROBES, pairs, padding=True, truncation=True, max_length=length, return_tensors="pt")
        b = out(PROBES, pairs, padding=True, truncation=True, max_length=length, return_tensors="pt")
        if any(a[k].shape != b[k].shape or not bool((a[k] == b[k]).all()) for k in ("input_ids", "attention_mask")):
            raise ValueError(f"{where}: pooling=eos: the tokenizer with an EOS template does not give the ids dpr "
                             f"encodes with (max_length {length}); export a pooling=last run, or use the run with dpr")
    return out
