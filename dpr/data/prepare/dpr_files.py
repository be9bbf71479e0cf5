"""DPR's published files (its own download list, ``dpr/data/download_data.py`` of facebookresearch/DPR) and
where a recipe finds each one, in this order:

1. ``data.passages=<path>``: the user's copy of ``psgs_w100.tsv``, read in place (never copied);
2. a mirror (``data.mirror_dir`` / ``$DPR_DATA_MIRROR``): ``<mirror>/dpr/<file>``, read in place, or
   ``<mirror>/dpr/<file>.gz``, decompressed once into the cache;
3. the cache ``<cache_dir>/dpr/<file>``, filled by a resumable download from ``data.base_url`` (gunzipped as
   it streams).

Every file's size and sha256 are recorded at first use in ``<cache_dir>/dpr/sha256.lock.json`` and checked
on every later use (`dpr.data.ledger`); ``data.sha256.<file>=<hex>`` pins a file (or its published ``.gz``).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Mapping

from dpr.data.download import Fetched, download, inflate_file
from dpr.data.ledger import LEDGER_NAME, Digest, check, check_source, entry_of, record, verify
from dpr.errors import DataError

log = logging.getLogger(__name__)

BASE_URL = "https://dl.fbaipublicfiles.com/dpr"
SUBDIR = "dpr"  # in the mirror and the cache

# stored (decompressed) name -> path under BASE_URL; a path ending in .gz is gunzipped as it streams
PUBLISHED = {
    "psgs_w100.tsv": "wikipedia_split/psgs_w100.tsv.gz",
    "biencoder-nq-train.json": "data/retriever/biencoder-nq-train.json.gz",
    "biencoder-nq-dev.json": "data/retriever/biencoder-nq-dev.json.gz",
    "nq-test.qa.csv": "data/retriever/nq-test.qa.csv",
    "biencoder-trivia-train.json": "data/retriever/biencoder-trivia-train.json.gz",
    "biencoder-trivia-dev.json": "data/retriever/biencoder-trivia-dev.json.gz",
    "trivia-test.qa.csv": "data/retriever/trivia-test.qa.csv.gz",
    "biencoder-squad1-train.json": "data/retriever/biencoder-squad1-train.json.gz",
    "biencoder-squad1-dev.json": "data/retriever/biencoder-squad1-dev.json.gz",
    "squad1-test.qa.csv": "data/retriever/squad1-test.qa.csv",
}
_HEX = re.compile(r"[0-9a-f]{64}")


def published_name(name: str) -> str:
    """The file's name as published (``psgs_w100.tsv.gz`` for ``psgs_w100.tsv``)."""
    return PUBLISHED[name].rsplit("/", 1)[-1]


def is_gzip(name: str) -> bool:
    return PUBLISHED[name].endswith(".gz")


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    # `data.sha256.psgs_w100.tsv=<hex>` reaches us nested ({psgs_w100: {tsv: hex}}): Hydra splits keys on dots
    if not isinstance(node, Mapping):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def read_pins(raw: Any, names: list[str]) -> dict[str, str]:
    """``data.sha256`` as ``{file name: lowercase hex}``; a name the recipe does not read or a value that is
    not a sha256 is refused (one line)."""
    if raw in (None, {}):
        return {}
    if not isinstance(raw, Mapping):
        raise DataError("data config", "expected a mapping {file name: sha256}", field="sha256")
    known = sorted({n for name in names for n in (name, published_name(name))})
    pins = {}
    for name, value in _flatten(raw).items():
        if name not in known:
            raise DataError("data config", f"no file {name!r} in this recipe (known: {', '.join(known)})",
                            field=f"sha256.{name}")
        if value is None:
            continue
        hexd = str(value).strip().lower()
        if not _HEX.fullmatch(hexd):
            raise DataError("data config", f"not a sha256 (64 hex digits): {str(value)[:80]!r}", field=f"sha256.{name}")
        pins[name] = hexd
    return pins


def fetch_sources(cfg: Mapping[str, Any], roles: Mapping[str, str], mirror: str | Path | None,
                  cache: str | Path) -> tuple[dict[str, Path], dict[str, dict]]:
    """Each role's file (checked against the ledger and the pins) and its fingerprint entry
    ``{file name: {path, size, sha256, lines}}``."""
    cache_dir = Path(cache) / SUBDIR
    ledger = cache_dir / LEDGER_NAME
    pins = read_pins(cfg.get("sha256"), list(roles.values()))
    base = str(cfg.get("base_url") or BASE_URL).rstrip("/")
    files: dict[str, Path] = {}
    sources: dict[str, dict] = {}
    for role, name in roles.items():
        local = cfg.get("passages") if role == "passages" else None
        path, digest = _resolve(name, local, mirror, cache_dir, base, ledger, pins)
        files[role] = path
        sources[name] = {"path": str(path.resolve()), **digest.as_dict()}
    return files, sources


def _resolve(name: str, local: str | None, mirror: str | Path | None, cache_dir: Path, base: str, ledger: Path,
             pins: Mapping[str, str]) -> tuple[Path, Digest]:
    gz = published_name(name)
    pin, gz_pin = pins.get(name), pins.get(gz) if gz != name else None
    if local:
        path = Path(local).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"data.passages: {path} not found")
        if path.name.endswith(".gz"):
            raise DataError(path, "a gzip file: the passages are read in place, so give the decompressed file "
                            f"(gunzip -k {path.name}), or put it in the mirror as {SUBDIR}/{gz}", field="passages")
        log.info("%s: the user's copy %s, read in place", name, path)
        return path, verify(ledger, name, path, pin, gz, gz_pin)
    if mirror:
        folder = Path(mirror) / SUBDIR
        if (folder / name).is_file():
            return folder / name, verify(ledger, name, folder / name, pin, gz, gz_pin)
        if gz == name or not (folder / gz).is_file():
            raise FileNotFoundError(f"{name}: neither {folder / name} nor {folder / gz} is in the data mirror "
                                    f"{mirror} (unset DPR_DATA_MIRROR / data.mirror_dir to download it)")
        dest = cache_dir / name
        if not dest.is_file():
            log.info("%s: decompressing %s into %s", name, folder / gz, dest)
            fetched = inflate_file(folder / gz, dest, check=_checker(dest, name, gz, pin, gz_pin, ledger))
            record(ledger, name, dest, fetched.digest, fetched.source)
            return dest, fetched.digest
        return dest, verify(ledger, name, dest, pin, gz, gz_pin)
    dest = cache_dir / name
    if dest.is_file():
        return dest, verify(ledger, name, dest, pin, gz, gz_pin)
    url = f"{base}/{PUBLISHED[name]}"
    log.info("%s: downloading %s", name, url)
    fetched = download(url, dest, is_gzip(name), check=_checker(dest, name, gz, pin, gz_pin, ledger))
    if fetched is None:  # another process (a second rank) downloaded it meanwhile
        return dest, verify(ledger, name, dest, pin, gz, gz_pin)
    record(ledger, name, dest, fetched.digest, fetched.source)
    return dest, fetched.digest


def _checker(dest: Path, name: str, gz: str, pin: str | None, gz_pin: str | None, ledger: Path):
    """The check a fresh copy passes before it lands: its pins, else what the ledger recorded for ``dest``
    (a file fetched again after the cached copy was deleted must be the same bytes)."""
    entry = entry_of(ledger, dest)

    def run(fetched: Fetched) -> None:
        check(dest, name, fetched.digest, entry, pin, ledger)
        check_source(dest, gz, fetched.source, gz_pin)
    return run
