#!/usr/bin/env bash
# GPU readiness check: the first thing to run on a GPU machine (under 10 minutes on one GPU).
#
#   bash scripts/gpu_check.sh                 # after: DPR_TORCH=torch DPR_EXTRA=gpu bash scripts/setup.sh
#   DATA_DIR=data/prepared OUT=runs/gpu_check PY=.venv/bin/python bash scripts/gpu_check.sh
#
# Stages, each timed and compared with the same work on this machine's CPU:
#   1. nccl   — DDP process group over NCCL (2 processes if >= 2 GPUs, else 1): all-reduce, the loss's
#               gradient-carrying all-gather, barrier (CPU reference: the same under gloo)
#   2. bf16 / fp16 — dpr-train steps on squad1_open under torchrun (DDP over NCCL), examples/s against CPU
#   3. faiss  — faiss-gpu: IVF-PQ k-means + adds on all GPUs (dpr.index, device=gpu) and a flat index
#               sharded over the GPUs, against the CPU build and search
#   4. pipeline — dpr-pipeline with short training on squad1_open; stage times against CPU_TIMINGS
#               (a CPU run's timings.json, default runs/squad1_open/timings.json if present)
# Exits 1 with one line when no GPU is visible; a failing stage prints one line and the log's tail.
set -euo pipefail

PY=${PY:-.venv/bin/python}
BIN=$(dirname "$PY")
DATA_DIR=${DATA_DIR:-data/prepared}
OUT=${OUT:-runs/gpu_check}
CPU_TIMINGS=${CPU_TIMINGS:-runs/squad1_open/timings.json}
export WANDB_MODE=${WANDB_MODE:-disabled} TOKENIZERS_PARALLELISM=false

if [ ! -x "$PY" ]; then
    echo "gpu_check: no Python at $PY (run scripts/setup.sh first, or set PY=)" >&2; exit 1
fi
NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
if [ "$NGPU" -lt 1 ]; then
    echo "gpu_check: no CUDA GPU visible to torch (torch.cuda.is_available() is False): nothing to check" >&2
    exit 1
fi
NPROC=$(( NGPU >= 2 ? 2 : 1 ))
mkdir -p "$OUT/logs"
echo "gpu_check: $NGPU GPU(s), DDP with $NPROC process(es); outputs and logs in $OUT"
"$PY" - <<'EOF'
import faiss, torch
from dpr.index import gpu_count
print(f"  torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.cuda.get_device_name(0)}, "
      f"bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}; faiss {faiss.__version__}, faiss GPUs {gpu_count()}")
EOF

declare -A SECONDS_OF
# run NAME CMD...: time CMD, its output in $OUT/logs/NAME.log; one line and the log's tail on failure
run() {
    local name=$1; shift
    local t0 t1
    t0=$(date +%s.%N)
    if ! "$@" >"$OUT/logs/$name.log" 2>&1; then
        echo "gpu_check: stage '$name' FAILED (log: $OUT/logs/$name.log)" >&2
        tail -n 20 "$OUT/logs/$name.log" >&2
        exit 1
    fi
    t1=$(date +%s.%N)
    SECONDS_OF[$name]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
}
ratio() { awk -v c="$1" -v g="$2" 'BEGIN { if (g > 0) printf "%.1fx", c / g; else print "n/a" }'; }
report() { printf '  %-30s %9s s   CPU %9s s   GPU speed-up %s\n' "$1" "$2" "$3" "$(ratio "$3" "$2")"; }

# ---------------------------------------------------------------- data
if [ ! -f "$DATA_DIR/squad1_open/passages.tsv" ]; then
    run prepare "$BIN/dpr-data" data=squad1_open data_dir="$DATA_DIR"
fi

# ---------------------------------------------------------------- 1. NCCL DDP
cat >"$OUT/nccl_check.py" <<'EOF'
import json, sys, time, torch
from dpr import distributed as D
assert D.init_distributed() or D.world_size() == 1
dev = D.device()
x = torch.ones(16 * 2**20, device=dev)                       # 64 MB all-reduce, 10 times
import torch.distributed as dist
if D.is_distributed():
    dist.all_reduce(x); D.barrier()
t0 = time.perf_counter()
for _ in range(10):
    if D.is_distributed():
        dist.all_reduce(x)
if dev.type == "cuda":
    torch.cuda.synchronize()
seconds = time.perf_counter() - t0
t = torch.full((D.rank() + 1, 4), float(D.rank()), device=dev, requires_grad=True)
g = D.all_gather_with_grad(t)
g.sum().backward()
assert g.shape[0] == sum(r + 1 for r in range(D.world_size())), g.shape
assert torch.allclose(t.grad, torch.full_like(t, float(D.world_size())))
if D.is_main():
    backend = dist.get_backend() if D.is_distributed() else "none"
    print(json.dumps({"backend": backend, "world": D.world_size(), "allreduce_64MB_x10_s": seconds}))
D.cleanup()
EOF
torchrun_() { "$PY" -m torch.distributed.run --standalone --nproc_per_node="$1" "${@:2}"; }
run nccl torchrun_ "$NPROC" "$OUT/nccl_check.py"
run gloo env CUDA_VISIBLE_DEVICES= "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 "$OUT/nccl_check.py"
NCCL_S=$(grep -o '"allreduce_64MB_x10_s": [0-9.e-]*' "$OUT/logs/nccl.log" | awk '{print $2}')
GLOO_S=$(grep -o '"allreduce_64MB_x10_s": [0-9.e-]*' "$OUT/logs/gloo.log" | awk '{print $2}')
echo "1. NCCL DDP ($NPROC process(es)): all-reduce 64 MB x10 ${NCCL_S}s (gloo on CPU, 2 processes: ${GLOO_S}s); gather/backward OK"

# ---------------------------------------------------------------- 2. bf16 / fp16 training steps
TRAIN=(data=squad1_open data_dir="$DATA_DIR" train.batch_size=32 train.hard_negatives=0 train.validate=false
       train.save_every=0 train.print_every=1000 overwrite=true)
ex_per_s() {  # median examples/s of a run's metrics.jsonl, skipping the first (warm-up) step
    "$PY" -c 'import json,statistics,sys; r=[json.loads(l)["examples_per_s"] for l in open(sys.argv[1])][1:]; print(round(statistics.median(r),2))' "$1/metrics.jsonl"
}
run train_cpu env CUDA_VISIBLE_DEVICES= "$BIN/dpr-train" "${TRAIN[@]}" train.max_steps=3 output_dir="$OUT/train_cpu"
CPU_EX=$(ex_per_s "$OUT/train_cpu")
echo "2. training steps (examples/s, batch 32 per process; CPU reference $CPU_EX examples/s):"
for prec in bf16 fp16; do
    if [ "$prec" = bf16 ] && ! "$PY" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_bf16_supported() else 1)'; then
        echo "  bf16: not supported by this GPU (skipped)"; continue
    fi
    run "train_$prec" torchrun_ "$NPROC" "$BIN/dpr-train" "${TRAIN[@]}" train.max_steps=30 train.precision="$prec" \
        output_dir="$OUT/train_$prec"
    GPU_EX=$(ex_per_s "$OUT/train_$prec")
    printf '  %-5s %8s examples/s   (%s x CPU; 30 steps + start-up in %s s)\n' "$prec" "$GPU_EX" \
        "$(awk -v g="$GPU_EX" -v c="$CPU_EX" 'BEGIN { printf "%.1f", g / c }')" "${SECONDS_OF[train_$prec]}"
done

# ---------------------------------------------------------------- 3. faiss-gpu
cat >"$OUT/faiss_check.py" <<'EOF'
import json, sys, tempfile, time
import numpy as np
from dpr.index import build_index, gpu_count, search, to_gpus
from dpr.index.shards import write_shard
assert gpu_count() > 0, "faiss has no GPU support (install faiss-gpu: DPR_EXTRA=gpu bash scripts/setup.sh)"
rng = np.random.default_rng(0)
x = rng.standard_normal((200_000, 384), dtype=np.float32); x /= np.linalg.norm(x, axis=1, keepdims=True)
q = x[:2000] + 0.05 * rng.standard_normal((2000, 384), dtype=np.float32)
emb = tempfile.mkdtemp(prefix="gpu_check_")
for s, part in enumerate(np.array_split(np.arange(len(x)), 4)):   # 4 shards, as dpr-encode writes them
    write_shard(emb, s, 4, x[part], [str(i) for i in part], normalized=True)
out = {}
for dev in ("gpu", "cpu"):
    t0 = time.perf_counter(); idx, ids = build_index(emb, factory="IVF1024,PQ48", device=dev, nprobe=32)
    out[f"ivfpq_build_{dev}_s"] = time.perf_counter() - t0
    t0 = time.perf_counter(); hits, _ = search(idx, ids, q, 20, progress=False)
    out[f"ivfpq_search_{dev}_s"] = time.perf_counter() - t0
flat, ids = build_index(emb)
t0 = time.perf_counter(); cpu_hits, _ = search(flat, ids, q, 20, progress=False); out["flat_search_cpu_s"] = time.perf_counter() - t0
sharded = to_gpus(flat, shard=True)
t0 = time.perf_counter(); gpu_hits, _ = search(sharded, ids, q, 20, progress=False); out["flat_search_gpu_s"] = time.perf_counter() - t0
out["flat_same_top1"] = float(np.mean([a[0] == b[0] for a, b in zip(cpu_hits, gpu_hits)]))
out["faiss_gpus"] = gpu_count()
print(json.dumps(out))
EOF
run faiss "$PY" "$OUT/faiss_check.py"
FJ=$(grep '^{' "$OUT/logs/faiss.log" | tail -1)
jget() { "$PY" -c 'import json,sys; print(round(json.loads(sys.argv[1])[sys.argv[2]], 3))' "$FJ" "$1"; }
echo "3. faiss-gpu over $(jget faiss_gpus) GPU(s), 200k x 384 vectors in 4 shards:"
report "IVF1024,PQ48 build (k-means+add)" "$(jget ivfpq_build_gpu_s)" "$(jget ivfpq_build_cpu_s)"
report "IVF1024,PQ48 search 2k queries" "$(jget ivfpq_search_gpu_s)" "$(jget ivfpq_search_cpu_s)"
report "flat (sharded) search 2k queries" "$(jget flat_search_gpu_s)" "$(jget flat_search_cpu_s)"
echo "  flat GPU vs CPU same top-1: $(jget flat_same_top1)"

# ---------------------------------------------------------------- 4. short pipeline
run pipeline "$BIN/dpr-pipeline" data=squad1_open data_dir="$DATA_DIR" output_dir="$OUT/pipeline" force=true \
    train.frozen_steps=20 train.max_steps=20 encode.batch_size=256 retrieve.batch_size=256
echo "4. dpr-pipeline on squad1_open (20 frozen + 20 two-tower steps) in ${SECONDS_OF[pipeline]} s; stages (GPU vs CPU_TIMINGS):"
"$PY" - "$OUT/pipeline/timings.json" "$CPU_TIMINGS" <<'EOF'
import json, os, sys
gpu = json.load(open(sys.argv[1]))["seconds"]
cpu = json.load(open(sys.argv[2]))["seconds"] if os.path.isfile(sys.argv[2]) else {}
for stage, s in gpu.items():
    c = cpu.get(stage)
    same_work = stage not in ("train", "total")  # training ran far fewer steps here
    extra = f"CPU {c:8.1f} s   speed-up {c / s:.1f}x" if c and s and same_work else ("CPU n/a" if not c else "(fewer steps than the CPU run)")
    print(f"  {stage:<32} {s:8.1f} s   {extra}")
EOF
grep -A3 "| system" "$OUT/pipeline/eval/report.md" | head -4 || true
echo "gpu_check: all stages passed"
