#!/usr/bin/env bash
# The offline GPU check: the first thing to run on a GPU machine (within 9 minutes on one H200).
#
#   OUT=runs/gpu_check bash scripts/gpu_check.sh                   # the project's deps already installed
#   OUT=runs/gpu_check bash scripts/gpu_check.sh --bundle <dir>    # install from scripts/offline_bundle.sh's
#                                                                  # bundle first, with no network
#   OUT=runs/gpu_check_cpu bash scripts/gpu_check.sh --cpu         # every stage that needs no GPU, on the CPU,
#                                                                  # tiny model + tiny data (CI: <= 3 min on 2 cores)
#
# Stages (each timed, its log in $OUT/logs/<stage>.log, GPU utilisation sampled by nvidia-smi while it runs):
#   facts     torch, CUDA, the GPUs, bf16, NCCL, faiss (and whether index.device=gpu uses faiss or torch)
#   ddp_gloo  two processes sharing one GPU under gloo: all-reduce, the loss's all-gather, DDP steps
#   ddp_nccl  with >= 2 GPUs: the same over NCCL, one GPU per process (skipped with one GPU)
#   pipeline  the README's main job unchanged; its figures against docs/results/reports/squad1_open.json's
#             95% intervals (--cpu: the tiny job, not compared)
#   teacher   the same run with teacher=true (the stages it leaves alone are reused)
#   bench     scripts/bench_gpu.py: ours against sentence-transformers on the same card
# Writes $OUT/gpu_check.json (docs/results/gpu.md lists its keys) and ends with the line
# "gpu_check: all stages passed" or "gpu_check: stage <name> failed" (exit 1).
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
OUT=${OUT:-runs/gpu_check}
DATA_DIR=${DATA_DIR:-$REPO/data/prepared}
MODE=gpu
BUNDLE=
while [ $# -gt 0 ]; do
    case $1 in
        --cpu) MODE=cpu ;;
        --bundle) BUNDLE=${2:?--bundle needs a directory}; shift ;;
        --bundle=*) BUNDLE=${1#--bundle=} ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (known: --cpu, --bundle <dir>)" >&2; exit 2 ;;
    esac
    shift
done
if [ -e "$OUT" ] && [ ! -d "$OUT" ]; then
    echo "gpu_check: OUT=$OUT is a file, not a directory: name a directory for the check's outputs" >&2; exit 2
fi
if [ -n "$BUNDLE" ] && [ ! -d "$BUNDLE" ]; then
    echo "gpu_check: --bundle $BUNDLE: no such directory (made by scripts/offline_bundle.sh)" >&2; exit 2
fi
# OUT is new, empty, or an earlier check's (its marker, or the stages.tsv every check writes): the check never writes among a user's own files
if [ -d "$OUT" ] && [ ! -f "$OUT/.dpr-gpu-check" ] && [ ! -f "$OUT/stages.tsv" ] && [ -n "$(ls -A "$OUT")" ]; then
    echo "gpu_check: OUT=$OUT holds files an earlier check did not write (no .dpr-gpu-check): name a new or empty directory" >&2
    exit 2
fi
mkdir -p "$OUT/logs" 2>/dev/null && OUT=$(cd "$OUT" && pwd) || {
    echo "gpu_check: OUT=$OUT: cannot create its logs/ directory there" >&2; exit 2; }
echo "written by scripts/gpu_check.sh: a rerun may write here" >"$OUT/.dpr-gpu-check"
: >"$OUT/stages.tsv"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" WANDB_MODE=${WANDB_MODE:-disabled} TOKENIZERS_PARALLELISM=false
export GPU_CHECK_MODE=$MODE HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
STAGES="$REPO/scripts/gpu_check_stages.py"
FAILED=

# the dpr commands: the console scripts when installed, else the modules (a checkout on PYTHONPATH)
dpr() { local name=$1; shift
    if [ -x "$(dirname "$PY")/dpr-$name" ]; then "$(dirname "$PY")/dpr-$name" "$@"
    else "$PY" -c "import sys; sys.argv[0] = 'dpr-$name'; from dpr.cli.$name import main; main()" "$@"; fi; }

# stage NAME CMD...: run, time and sample the GPU; one line per stage; the first failure is the one named
stage() {
    local name=$1; shift
    local t0 t1 rc sampler= util=("" "")
    if [ "$MODE" = gpu ] && command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 >"$OUT/logs/$name.util" 2>/dev/null &
        sampler=$!
    fi
    t0=$(date +%s.%N)
    "$@" >"$OUT/logs/$name.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    if [ -n "$sampler" ]; then
        kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
        read -r -a util < <(awk -F, '$1 ~ /^ *[0-9]/ { s += $1; n++; if ($1 > m) m = $1 } END { if (n) printf "%.1f %d", s / n, m }' "$OUT/logs/$name.util")
    fi
    local secs; secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    if [ $rc -ne 0 ]; then
        printf '%s\tfailed\t%s\t%s\t%s\n' "$name" "$secs" "${util[0]:-}" "${util[1]:-}" >>"$OUT/stages.tsv"
        echo "gpu_check: stage $name FAILED after ${secs}s (log: $OUT/logs/$name.log)" >&2
        tail -n 15 "$OUT/logs/$name.log" >&2
        FAILED=${FAILED:-$name}
        return 1
    fi
    printf '%s\tpassed\t%s\t%s\t%s\n' "$name" "$secs" "${util[0]:-}" "${util[1]:-}" >>"$OUT/stages.tsv"
    echo "gpu_check: $name passed in ${secs}s${util[0]:+ (GPU util mean ${util[0]} %, max ${util[1]} %)}"
}
skip() { printf '%s\tskipped\t\t\t\n' "$1" >>"$OUT/stages.tsv"; echo "gpu_check: $1 skipped ($2)"; }
finish() { "$PY" "$STAGES" summary "$OUT"; exit $?; }

# ------------------------------------------------------------------ install from a bundle (no network)
install_bundle() {
    local b=$1
    [ -f "$b/bundle.json" ] || { echo "no bundle.json in $b (made by scripts/offline_bundle.sh)"; return 1; }
    "$PY" "$REPO/scripts/bundle_weights.py" restore "$b/minilm" "$OUT/bundle_wheels" || return 1
    if [ -f "$b/wheels.tar.xz" ]; then   # the wheels stored and xz-compressed together (scripts/bundle_wheels.py)
        "$PY" "$REPO/scripts/bundle_wheels.py" unpack "$b/wheels.tar.xz" "$OUT/bundle_wheels" || return 1
    fi
    local links=(--find-links "$OUT/bundle_wheels")
    [ -d "$b/wheels" ] && links+=(--find-links "$b/wheels")   # a bundle of an older offline_bundle.sh
    # shellcheck disable=SC2046
    "$PY" -m pip install --no-index "${links[@]}" $(ls "$b"/wheels/*.whl 2>/dev/null) "$OUT"/bundle_wheels/*.whl \
        || return 1
    if [ -f "$b/data/squad-v1.1/dev-v1.1.json" ]; then
        export DPR_DATA_MIRROR="$b/data"
    fi
}
if [ -n "$BUNDLE" ]; then
    BUNDLE=$(cd "$BUNDLE" && pwd)
    stage install install_bundle "$BUNDLE" || finish
fi

# ------------------------------------------------------------------ facts
stage facts "$PY" "$STAGES" facts "$OUT/facts.json" || finish
NGPU=$("$PY" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["gpus"]))' "$OUT/facts.json")
if [ "$MODE" = gpu ] && [ "$NGPU" -lt 1 ]; then
    echo "gpu_check: no CUDA GPU visible to torch; run with --cpu for the stages that need none" >&2
    FAILED=facts
    printf 'facts\tfailed\t\t\t\n' >>"$OUT/stages.tsv"
    finish
fi
DEV=cuda; [ "$MODE" = cpu ] && DEV=cpu

# ------------------------------------------------------------------ DDP
torchrun_() { "$PY" -m torch.distributed.run --standalone --nproc_per_node="$1" "${@:2}"; }
stage ddp_gloo torchrun_ 2 "$STAGES" ddp "$OUT/ddp_gloo.json" --backend gloo --device "$DEV"
if [ "$MODE" = gpu ] && [ "$NGPU" -ge 2 ]; then
    stage ddp_nccl torchrun_ 2 "$STAGES" ddp "$OUT/ddp_nccl.json" --backend nccl --device cuda
else
    skip ddp_nccl "needs 2 GPUs; $NGPU here"
fi

# ------------------------------------------------------------------ the README's main job, then teacher=true
if [ "$MODE" = cpu ]; then
    TINY="$OUT/tiny"
    "$PY" "$STAGES" tiny-model "$TINY/model" >"$OUT/logs/tiny.log" 2>&1 && "$PY" "$STAGES" tiny-data "$TINY/data" \
        >>"$OUT/logs/tiny.log" 2>&1 || { echo "gpu_check: cannot build the tiny model/data (log: $OUT/logs/tiny.log)" >&2; }
    JOB=(data.name=tiny data.kind=qa data.recipe=none "data_dir=$TINY/data" "model.name=$TINY/model"
         model.shared=false model.pooling=cls model.similarity=dot model.temperature=1.0 train.max_steps=4
         train.batch_size=4 train.hard_negatives=1 train.save_every=0 train.val_max_questions=4 train.lr=1e-3
         train.frozen_steps=2 bm25.num_negatives=3 retrieve.k=5 encode.batch_size=4 hybrid.metric_k=1)
    TEACHER=(teacher=true "teacher.rerank.model=$TINY/model" teacher.rerank.max_length=64
             teacher.rerank.train.max_steps=2 teacher.rerank.train.batch_size=4 teacher.rerank.train.negatives=2
             teacher.rerank.train.save_every=0 teacher.rerank.score.k=5 "teacher.k_grid=[2,5]")
else
    JOB=(data=squad1_open "data_dir=$DATA_DIR")   # README: dpr-pipeline data=squad1_open data_dir=... output_dir=...
    TEACHER=(teacher=true)
fi
stage pipeline dpr pipeline "${JOB[@]}" "output_dir=$OUT/pipeline"
if [ "$MODE" = gpu ] && [ -f "$OUT/pipeline/eval/report.json" ]; then
    stage compare_default "$PY" "$STAGES" compare "$OUT/pipeline/eval/report.json" \
        "$REPO/docs/results/reports/squad1_open.json" "$OUT/compare_default.json"
else
    skip compare_default "the tiny job's figures have no committed counterpart"
fi
cp "$OUT/pipeline/eval/report.json" "$OUT/report_default.json" 2>/dev/null
# teacher=true on the same run (as a user adds it): the stages it does not change are reused
stage teacher dpr pipeline "${JOB[@]}" "${TEACHER[@]}" "output_dir=$OUT/pipeline"
cp "$OUT/pipeline/eval/report.json" "$OUT/report_teacher.json" 2>/dev/null

# ------------------------------------------------------------------ ours against sentence-transformers
if [ "$MODE" = cpu ]; then
    stage bench "$PY" "$REPO/scripts/bench_gpu.py" --device cpu --model "$TINY/model" --data-dir "$TINY/data" \
        --data tiny --steps 3 --batch-size 4 --encode-n 8 --encode-batch-size 4 --rerank-pairs 8 \
        --rerank-batch-size 2 --quick --out-dir "$OUT/logs" --json "$OUT/bench_gpu.json" --md "$OUT/bench_gpu.md"
else
    stage bench "$PY" "$REPO/scripts/bench_gpu.py" --device cuda --data-dir "$DATA_DIR" --out-dir "$OUT/logs" \
        --json "$OUT/bench_gpu.json" --md "$OUT/bench_gpu.md"
fi
finish
