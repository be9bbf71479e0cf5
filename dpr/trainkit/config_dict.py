"""``plain(cfg)``: a config as plain Python containers, whatever it came as (a Hydra/OmegaConf node, a
dataclass, a mapping), so trainers, stages and fingerprints see one form: dicts, lists and scalars with every
``${...}`` interpolation resolved."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


def plain(cfg: Any) -> Any:
    """``cfg`` as plain containers: an OmegaConf node through ``OmegaConf.to_container(resolve=True)``, a
    dataclass instance through ``dataclasses.asdict``, any other mapping (which may hold OmegaConf nodes or
    interpolations) through OmegaConf and back; None and anything else are returned as they are."""
    if cfg is None:
        return None
    from omegaconf import DictConfig, ListConfig, OmegaConf  # here, so that importing this module stays light

    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    if isinstance(cfg, Mapping):
        return OmegaConf.to_container(OmegaConf.create(dict(cfg)), resolve=True)
    return cfg


__all__ = ["plain"]
