"""Dataset preparation: one recipe module per dataset, and `prepare_dataset`, which fetches the
recipe's sources, builds ``<data_dir>/<name>/`` in a temporary directory and renames it into place.

A recipe module defines ``KIND`` ("qa" | "qrels"), ``VERSION`` (bump it when its output changes),
``SOURCES`` ({role: registry name}), ``DEFAULTS`` (the config keys it reads, with defaults) and
``build(cfg, files, out) -> {"counts": ..., "notes": [...], ...}`` which writes into ``out``.
A recipe over files the registry holds no digest for (DPR's) defines ``fetch_sources(cfg, mirror, cache) ->
(files, {file: {path, size, sha256, ...}})`` instead: it runs before the up-to-date check (a changed file is
refused even when nothing would be rebuilt), its digests join the fingerprint, and ``build`` gets them as
``sources=``. An output that is a symbolic link (DPR's 13 GB passages, read in place) is recorded with its
size and target, not hashed again.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from dpr.atomic import atomic_path, carry_over, check_replaceable, sha256_file, write_json_atomic
from dpr.data.dataset import DatasetPaths
from dpr.data.prepare import beir, import_, nfcorpus, nq_open_dev, sciq_open, squad1_open
from dpr.data.prepare.dpr_published import published_recipe
from dpr.data.sources import DEFAULT_CACHE_DIR, default_mirror_dir, fetch, load_registry
from dpr.errors import DataError
from dpr.trainkit.config_dict import plain

log = logging.getLogger(__name__)

# a recipe: a module, or a namespace with a module's attributes (DPR's datasets share one recipe)
RECIPES: dict[str, ModuleType | SimpleNamespace] = {
    "squad1_open": squad1_open,
    "sciq_open": sciq_open,
    "nfcorpus": nfcorpus,
    "nq_open_dev": nq_open_dev,
    "beir": beir,
    "import": import_,
    "dpr_nq": published_recipe("nq"),
    "dpr_trivia": published_recipe("trivia"),
    "dpr_squad1": published_recipe("squad1"),
}


def _recipe_config(cfg: dict, recipe: ModuleType) -> dict:
    """Only the keys the recipe reads (with its defaults): unrelated keys other tools add to the data
    config (and where the mirror or cache is) must not force a rebuild."""
    # a key set to null in the config stays null (e.g. max_positives: null = no cap); only absent keys default
    return {k: cfg[k] if k in cfg else default for k, default in recipe.DEFAULTS.items()}


def _fingerprint(name: str, recipe_name: str, recipe: ModuleType, rcfg: dict, registry: dict,
                 local: dict[str, Path] | None = None, fetched: dict[str, dict] | None = None) -> dict:
    sources: dict = {registry[s].path: registry[s].sha256 for s in recipe.SOURCES.values()}
    sources.update({str(f.resolve()): sha256_file(f) for f in (local or {}).values()})
    sources.update(fetched or {})
    return {
        "name": name,
        "kind": recipe.KIND,
        "recipe": recipe_name,
        "recipe_version": recipe.VERSION,
        "config": rcfg,
        "sources": sources,
    }


def check_dataset_name(name: str) -> None:
    """A dataset name is one path component: ``<data_dir>/<name>`` is replaced as a whole, so ``../x``,
    ``a/b`` or an absolute path would point that replacement at a directory outside ``data_dir``."""
    bad = name in (".", "..") or "/" in name or "\\" in name or "\0" in name or name != name.strip()
    if bad:
        raise DataError("data config", f"{name!r} is not a dataset name: give one word (letters, digits, '-', "
                        "'_', '.'), not a path; the dataset goes to <data_dir>/<name>", field="name")


def is_prepared_dataset(root: Path) -> bool:
    """``root`` holds a dataset `prepare_dataset` wrote (its ``meta.json`` with recipe and outputs), the only
    kind of directory preparing into ``<data_dir>/<name>`` may replace."""
    try:
        meta = DatasetPaths(root).read_meta()
    except (DataError, OSError):
        return False
    return isinstance(meta, dict) and "recipe" in meta and isinstance(meta.get("outputs"), dict)


# Files later stages legitimately rewrite in place: `dpr-bm25 mine=true` adds hard negatives to the
# training files. Their size is not compared, or every pipeline run would rebuild (and re-mine) the dataset.
REWRITTEN_DOWNSTREAM = frozenset({"train.json", "dev.json"})


def is_up_to_date(root: Path, fingerprint: dict) -> bool:
    """True when ``root/meta.json`` records the same recipe, config and sources, and every output file
    it lists is still there (with its recorded size, except the training files the miner rewrites)."""
    try:
        meta = DatasetPaths(root).read_meta()
    except DataError:
        return False
    if any(meta.get(k) != v for k, v in fingerprint.items()):
        return False
    outputs = meta.get("outputs")
    if not isinstance(outputs, dict) or not outputs:
        return False
    for rel, info in outputs.items():
        f = root / rel
        if not f.is_file() or not isinstance(info, dict):
            return False
        if rel not in REWRITTEN_DOWNSTREAM and f.stat().st_size != info.get("bytes"):
            return False
    return True


def _output_entry(f: Path) -> dict:
    if f.is_symlink():  # a large source read in place: its digest is in the fingerprint's sources
        return {"bytes": f.stat().st_size, "link": str(f.resolve())}
    return {"bytes": f.stat().st_size, "sha256": sha256_file(f)}


# What the commands derive from a dataset inside its directory: dropped with the data it was derived from.
DERIVED = frozenset({"bm25_index"})


def _recorded_outputs(root: Path) -> set[str]:
    """The entries an earlier build wrote in ``root`` (its ``meta.json`` and recorded outputs), which a rebuild
    replaces; every other entry there is the user's."""
    try:
        outputs = DatasetPaths(root).read_meta().get("outputs") or {}
    except (DataError, OSError, AttributeError):
        return set()
    return {"meta.json", *DERIVED, *(Path(rel).parts[0] for rel in outputs)}


def prepare_dataset(
    data_cfg: Any,
    data_dir: str | Path,
    mirror_dir: str | Path | None = None,
    force: bool = False,
    cache_dir: str | Path | None = None,
) -> Path:
    """Prepare the dataset described by ``data_cfg`` (a ``conf/data/<name>.yaml`` config or a dict with
    at least ``name``; ``recipe`` defaults to the name) into ``<data_dir>/<name>/`` and return that path.

    The mirror is ``mirror_dir``, else ``data_cfg.mirror_dir``, else ``$DPR_DATA_MIRROR``; without one,
    sources are downloaded into ``cache_dir`` (default ``data/cache``). Nothing is done when
    ``meta.json`` shows the same recipe/config/sources (logged "up to date") unless ``force``. The whole
    directory is built aside and renamed at the end: a failure leaves no partial output.
    """
    cfg = plain(data_cfg)
    if not isinstance(cfg, dict):
        raise TypeError(f"expected a mapping for the data config, got {type(data_cfg).__name__}")
    name = cfg.get("name")
    if not isinstance(name, str) or not name:
        raise DataError("data config", "missing", field="name")
    check_dataset_name(name)
    recipe_name = cfg.get("recipe") or name
    if recipe_name not in RECIPES:
        raise DataError("data config", f"unknown recipe {recipe_name!r} (known: {', '.join(RECIPES)})", field="recipe")
    recipe = RECIPES[recipe_name]
    if cfg.get("kind", recipe.KIND) != recipe.KIND:
        raise DataError("data config", f"recipe {recipe_name!r} makes {recipe.KIND!r} data, config says {cfg['kind']!r}", field="kind")
    registry = load_registry()
    rcfg = _recipe_config(cfg, recipe)
    # a recipe over the user's own files (beir) names them itself; registry recipes fetch theirs below
    local = recipe.local_sources(rcfg) if hasattr(recipe, "local_sources") else {}
    # an explicit `mirror_dir: null` in the config means "download", so $DPR_DATA_MIRROR is only the
    # fallback when the key is absent
    mirror = mirror_dir or (cfg.get("mirror_dir") if "mirror_dir" in cfg else default_mirror_dir())
    cache = cache_dir or cfg.get("cache_dir") or DEFAULT_CACHE_DIR
    root = Path(data_dir) / name
    fetched: dict[str, dict] | None = None
    if hasattr(recipe, "fetch_sources"):
        check_replaceable(root, directory=True, owned=is_prepared_dataset)  # before 13 GB are downloaded
        local, fetched = recipe.fetch_sources(cfg, mirror, cache)
    fingerprint = _fingerprint(name, recipe_name, recipe, rcfg, registry, {} if fetched is not None else local,
                               fetched)
    if not force and is_up_to_date(root, fingerprint):
        log.info("%s: up to date (%s)", name, root)
        return root

    log.info("%s: preparing into %s (sources from %s)", name, root, f"mirror {mirror}" if mirror else f"download cache {cache}")
    check_replaceable(root, directory=True, owned=is_prepared_dataset)  # before any source is read
    files = {role: fetch(src, mirror, cache, registry) for role, src in recipe.SOURCES.items()} | local
    with atomic_path(root, owned=is_prepared_dataset) as tmp:
        tmp.mkdir(parents=True)
        result = recipe.build(rcfg, files, tmp, **({"sources": fetched} if fetched is not None else {}))
        outputs = {str(f.relative_to(tmp)): _output_entry(f) for f in sorted(tmp.rglob("*")) if f.is_file()}
        meta = {**fingerprint, **{k: v for k, v in result.items() if k not in fingerprint}, "outputs": outputs}
        write_json_atomic(tmp / "meta.json", meta)
        carry_over(root, tmp, _recorded_outputs(root))  # the user's own files there (a passages.tsv) stay
    log.info("%s: done: %s", name, meta.get("counts"))
    return root


__all__ = ["prepare_dataset", "is_up_to_date", "RECIPES"]
