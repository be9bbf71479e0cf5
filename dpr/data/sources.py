"""The dataset registry (``data/registry.yaml``) and fetching raw files: from a local mirror when one is
configured, else downloaded into a cache; every file's sha256 is checked before anyone reads it."""

from __future__ import annotations

import logging
import os
import shutil
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tqdm.auto import tqdm

from dpr.atomic import atomic_path, sha256_file
from dpr.errors import DataError
from dpr.resources import default_cache_dir, registry_path

log = logging.getLogger(__name__)

# data/ sits at the repository root next to conf/; a wheel ships registry.yaml inside the package (dpr.resources).
REPO_ROOT = Path(__file__).resolve().parents[2]
REGISTRY_PATH = registry_path()  # data/registry.yaml, or the copy a wheel ships
DEFAULT_CACHE_DIR = default_cache_dir()  # <repo>/data/cache; ./data/cache for an installed wheel


@dataclass(frozen=True)
class Source:
    """One raw file: its place in the mirror/cache layout, where to get it, and its digest."""

    name: str
    path: str
    sha256: str
    size: int | None = None
    url: str | None = None
    archive: str | None = None
    member: str | None = None
    license: str | None = None
    citation: str | None = None

    @property
    def file(self) -> str:
        return Path(self.path).name


def load_registry(path: str | Path = REGISTRY_PATH) -> dict[str, Source]:
    """Parse the registry into ``{name: Source}``."""
    import yaml

    path = Path(path)
    with open(path, encoding="utf-8") as f:
        raw = yaml.safe_load(f) or {}
    entries = raw.get("sources")
    if not isinstance(entries, dict):
        raise DataError(path, "expected a mapping 'sources: {name: entry}'", field="sources")
    out = {}
    for name, entry in entries.items():
        out[name] = _source_from(name, entry, path)
    return out


def _source_from(name: str, entry: Mapping[str, Any], where: str | Path = "<entry>") -> Source:
    if not isinstance(entry, Mapping):
        raise DataError(where, f"entry {name!r} is not a mapping", field=name)
    for key in ("path", "sha256"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise DataError(where, f"entry {name!r} has no {key}", field=f"{name}.{key}")
    if not entry.get("url") and not entry.get("archive"):
        raise DataError(where, f"entry {name!r} needs a url or an archive", field=f"{name}.url")
    known = set(Source.__dataclass_fields__) - {"name"}
    return Source(name=name, **{k: v for k, v in entry.items() if k in known})


def get_source(name_or_entry: str | Source | Mapping[str, Any], registry: Mapping[str, Source] | None = None) -> Source:
    if isinstance(name_or_entry, Source):
        return name_or_entry
    if isinstance(name_or_entry, Mapping):
        return _source_from(str(name_or_entry.get("name", "<inline>")), name_or_entry)
    registry = registry if registry is not None else load_registry()
    if name_or_entry not in registry:
        raise DataError(REGISTRY_PATH, f"unknown source {name_or_entry!r} (known: {', '.join(sorted(registry))})", field="sources")
    return registry[name_or_entry]


def default_mirror_dir() -> str | None:
    return os.environ.get("DPR_DATA_MIRROR") or None


def verify(path: Path, src: Source) -> str:
    """Check the sha256 (and size) of ``path`` against ``src``; returns the digest."""
    digest = sha256_file(path)
    if digest != src.sha256:
        size = path.stat().st_size
        also = f" (size {size} bytes, expected {src.size})" if src.size is not None and size != src.size else ""
        raise DataError(path, f"sha256 mismatch for {src.name}: expected {src.sha256}, got {digest}{also}", field="sha256")
    return digest


def fetch(
    source: str | Source | Mapping[str, Any],
    mirror_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    registry: Mapping[str, Source] | None = None,
) -> Path:
    """Return a local, checksum-verified path of a registry source.

    With ``mirror_dir`` set the file is read in place from ``<mirror_dir>/<path>`` (never copied, never
    downloaded: a mirror means "offline, use these files"). Without it the file comes from the cache
    ``<cache_dir>/<path>`` (default ``data/cache``), downloaded from its URL or extracted from its
    archive on first use. A size or sha256 mismatch is a `DataError` naming file, expected and actual.
    """
    registry = registry if registry is not None else load_registry()
    src = get_source(source, registry)
    if mirror_dir:
        path = Path(mirror_dir) / src.path
        if not path.is_file():
            raise FileNotFoundError(f"{src.name}: {path} not found in the data mirror {mirror_dir} (unset DPR_DATA_MIRROR / data.mirror_dir to download)")
        verify(path, src)
        return path
    cache = Path(cache_dir) if cache_dir else DEFAULT_CACHE_DIR
    path = cache / src.path
    if path.is_file():
        try:
            verify(path, src)
            return path
        except DataError as err:  # the cache is ours: a damaged file is fetched again
            log.warning("%s; fetching it again", err)
            path.unlink()
    with atomic_path(path) as tmp:
        if src.archive:
            archive = fetch(src.archive, None, cache, registry)
            _extract_member(archive, src, tmp)
        else:
            _download(src, tmp)
        verify(tmp, src)  # inside the atomic block: a bad download never lands in the cache
    return path


def _download(src: Source, dest: Path) -> None:
    if not src.url:
        raise DataError(REGISTRY_PATH, f"source {src.name!r} has no url", field=f"{src.name}.url")
    log.info("downloading %s from %s", src.name, src.url)
    try:
        with urllib.request.urlopen(src.url, timeout=60) as resp, open(dest, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0) or src.size
            # disable=None: no bar when stderr is not a terminal (keeps CLI errors one line)
            with tqdm(total=total, unit="B", unit_scale=True, desc=src.file, disable=None) as bar:
                while block := resp.read(1 << 20):
                    out.write(block)
                    bar.update(len(block))
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise DataError(src.url, f"download of {src.name} failed ({reason}); set DPR_DATA_MIRROR or data.mirror_dir to a local copy", field="url") from None


def _extract_member(archive: Path, src: Source, dest: Path) -> None:
    member = src.member or src.file
    with zipfile.ZipFile(archive) as zf:
        # match as a path suffix: re-packed copies of the same zip differ in their top folder
        names = [n for n in zf.namelist() if n == member or n.endswith("/" + member)]
        if len(names) != 1:
            raise DataError(archive, f"expected one member matching {member!r}, found {names or 'none'}", field="member")
        log.info("extracting %s from %s", names[0], archive.name)
        with zf.open(names[0]) as fin, open(dest, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
