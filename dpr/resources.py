"""Where the package's own files are: the Hydra configs and the dataset registry.

A wheel ships them inside the package (``dpr/conf/``, ``dpr/_registry/registry.yaml``, mapped from the
top-level ``conf/`` and ``data/`` by ``setup.py``); a source tree or an editable install reads the
top-level folders themselves. Importing this module also registers the OmegaConf resolvers the
configs use (``dpr_basename``: ``conf/data/beir.yaml`` names a dataset after its folder).
"""

from __future__ import annotations

from pathlib import Path

from dpr.errors import DataError

PACKAGE_DIR = Path(__file__).resolve().parent


def conf_dir() -> Path:
    """The directory holding ``train.yaml`` & co.: the installed copy when there is one, else ``<repo>/conf``."""
    packaged = PACKAGE_DIR / "conf"
    return packaged if (packaged / "train.yaml").is_file() else PACKAGE_DIR.parent / "conf"


def registry_path() -> Path:
    """The dataset registry ``registry.yaml`` (installed copy, else ``<repo>/data/registry.yaml``)."""
    packaged = PACKAGE_DIR / "_registry" / "registry.yaml"
    return packaged if packaged.is_file() else PACKAGE_DIR.parent / "data" / "registry.yaml"


def default_cache_dir() -> Path:
    """Where downloaded sources are cached: ``<repo>/data/cache`` in a source tree, ``./data/cache``
    (the working directory) for an installed wheel, never inside site-packages."""
    repo_data = PACKAGE_DIR.parent / "data"
    return repo_data / "cache" if (repo_data / "registry.yaml").is_file() else Path("data") / "cache"


def folder_name(path: str | Path) -> str:
    """The dataset name a folder gives (its last component, e.g. ``scifact`` for ``~/beir/scifact/``);
    here, below `dpr.data`, because the config resolver and the beir recipe both name datasets so."""
    name = Path(str(path)).expanduser().resolve().name
    if not name:
        raise DataError(path, "cannot name a dataset after this folder", field="path")
    return name


def _basename(path: object) -> str:
    """``${dpr_basename:${.path}}``: a folder's name (null path → "beir", so the error comes from the
    recipe, naming the missing ``data.path``)."""
    if path in (None, ""):
        return "beir"
    return folder_name(str(path))


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("dpr_basename"):
        OmegaConf.register_new_resolver("dpr_basename", _basename)


CONF_DIR = str(conf_dir())
register_resolvers()
