#!/usr/bin/env python
"""The offline bundle's wheels as one ``wheels.tar.xz``, and the bundle's size against its limit.

A wheel is a zip whose members are deflated; deflate packs shared libraries poorly, and xz over deflated data
gains nothing. ``pack`` therefore stores each wheel again with its members uncompressed (the same names, bytes
and order, so its ``RECORD`` still holds) and xz-compresses them together: faiss-cpu 1.15.1's wheel for
manylinux_2_28 (mostly OpenBLAS and libfaiss) goes from 18.0 MiB to 9.0 MiB. ``unpack`` writes the wheels back
out; pip installs a stored zip like a deflated one. ``describe`` writes ``bundle.json`` (what is inside, with
sizes) and says whether the bundle fits its limit.

    python scripts/bundle_wheels.py pack <wheels dir> <bundle>/wheels.tar.xz
    python scripts/bundle_wheels.py unpack <bundle>/wheels.tar.xz <wheel dir>
    python scripts/bundle_wheels.py describe <bundle> <limit MiB> <python> <platform> [--random-weights]

Exit 2: a wheel or an archive that cannot be read (one line naming it); ``describe``: exit 1 over the limit, with
the largest wheels named. The standard library only: ``unpack`` runs before anything is installed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import zipfile
from pathlib import Path

ARCHIVE = "wheels.tar.xz"
PARTS = ("wheels", ARCHIVE, "minilm", "data")  # bundle.json's parts_mib ("wheels": an unpacked wheels/ folder)
XZ_PRESET = 6  # 9 gains 0.07 MiB on faiss-cpu's wheel for 40 % more time


def stored(wheel: Path) -> bytes:
    """``wheel`` as a zip with every member stored uncompressed, member for member."""
    out = io.BytesIO()
    try:
        with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
            for info in src.infolist():
                copy = zipfile.ZipInfo(info.filename, info.date_time)
                copy.external_attr, copy.compress_type = info.external_attr, zipfile.ZIP_STORED
                dst.writestr(copy, src.read(info))
    except (zipfile.BadZipFile, EOFError) as err:
        raise ValueError(f"{wheel}: not a wheel (zip): {err}") from None
    return out.getvalue()


def pack(wheels: Path, archive: Path) -> int:
    """Every ``*.whl`` of ``wheels`` stored uncompressed, together in an xz tar at ``archive``; returns its size."""
    files = sorted(wheels.glob("*.whl"))
    tmp = archive.with_name(f".{archive.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w:xz", preset=XZ_PRESET) as tar:
            for wheel in files:
                data = stored(wheel)
                info = tarfile.TarInfo(wheel.name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        tmp.replace(archive)
    finally:
        tmp.unlink(missing_ok=True)
    return archive.stat().st_size


def unpack(archive: Path, dest: Path) -> list[Path]:
    """The wheels of ``pack``'s archive written into ``dest``; a member that is not a plain ``*.whl`` file name is
    refused (an archive from elsewhere must not write outside ``dest``)."""
    out = []
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:xz") as tar:
            for member in tar:
                if not member.isfile() or "/" in member.name or not member.name.endswith(".whl"):
                    raise ValueError(f"{archive}: member {member.name!r} is not a wheel file name")
                data = tar.extractfile(member).read()
                path = dest / member.name
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_bytes(data)
                tmp.replace(path)
                out.append(path)
    except (tarfile.TarError, EOFError) as err:
        raise ValueError(f"{archive}: not a whole xz tar of wheels ({err}): make the bundle again") from None
    return out


def describe(bundle: Path, limit_mib: float, python: str, platform: str, random_weights: bool,
             shown_as: Path | None = None) -> tuple[dict, str]:
    """``bundle.json``'s content for ``bundle`` and an over-the-limit message ("" when it fits) naming it
    ``shown_as`` (where it will be: the script builds it beside its place)."""
    def size(p: Path) -> int:
        return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())

    total = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file() and f.name != "bundle.json")
    wheels = sorted(((f.stat().st_size, f.name) for f in (bundle / "wheels").glob("*.whl")), reverse=True)
    if (bundle / ARCHIVE).is_file():
        with tarfile.open(bundle / ARCHIVE, "r:xz") as tar:  # sizes stored uncompressed: their order, not the bytes
            wheels = sorted(((m.size, m.name) for m in tar if m.isfile()), reverse=True)
    info = {"python": python, "platform": platform, "random_weights": random_weights,
            "bytes": total, "mib": round(total / 2**20, 1), "limit_mib": limit_mib,
            "parts_mib": {part: round(size(bundle / part) / 2**20, 1) for part in PARTS if (bundle / part).exists()},
            "wheels": [name for _, name in wheels]}
    over = ""
    if total > limit_mib * 2**20:
        over = (f"{shown_as or bundle}: {info['mib']} MiB is over the limit of {limit_mib:g} MiB; largest wheels (unpacked): "
                + ", ".join(f"{n} ({s / 2**20:.1f} MiB)" for s, n in wheels[:6])
                + " (pass --have <the target's pip freeze> to leave out what it has)")
    return info, over


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("wheels", type=Path)
    p.add_argument("archive", type=Path)
    u = sub.add_parser("unpack")
    u.add_argument("archive", type=Path)
    u.add_argument("dest", type=Path)
    d = sub.add_parser("describe")
    d.add_argument("bundle", type=Path)
    d.add_argument("limit_mib", type=float)
    d.add_argument("python")
    d.add_argument("platform")
    d.add_argument("--random-weights", action="store_true")
    d.add_argument("--shown-as", type=Path, default=None, help="the bundle's final place, for the messages")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "pack":
            n = pack(args.wheels, args.archive)
            print(f"bundle_wheels: {args.archive}: {n / 2**20:.1f} MiB")
        elif args.cmd == "unpack":
            print(f"bundle_wheels: {len(unpack(args.archive, args.dest))} wheels into {args.dest}")
        else:
            info, over = describe(args.bundle, args.limit_mib, args.python, args.platform, args.random_weights,
                                  args.shown_as)
            (args.bundle / "bundle.json").write_text(json.dumps(info, indent=1))
            print(f"offline_bundle: {args.shown_as or args.bundle}: {info['mib']} MiB ({info['parts_mib']}), "
                  f"limit {args.limit_mib:g} MiB")
            if over:
                print(f"offline_bundle: {over}", file=sys.stderr)
                return 1
    except ValueError as err:
        print(f"bundle_wheels: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"bundle_wheels: {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
