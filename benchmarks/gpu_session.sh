#!/usr/bin/env bash
# Every GPU figure of docs/PERFORMANCE.md in one command, for a short loan of one GPU machine.
#
#   bash benchmarks/gpu_session.sh            # writes into $OUT (default benchmarks/out)
#   PART=2 bash benchmarks/gpu_session.sh     # only part 2 (ResIST, local SGD); PART=3: memory only;
#                                             # PART=4: GPipe and 1F1B beside FDG, with where the
#                                             # host's time goes (--host_breakdown)
#
# Time on an H200 (2026-11-26): parts 1 and 2 finished inside a 455 s limit that then stopped part 3, and
# part 3 alone did not finish in 170 s (8 fresh processes, each compiling its run; its lines now come as each
# run ends), so a 15-minute loan runs parts 1 and 2 in one call and part 3 in a second. Each command's start
# is stamped with the seconds so far, so the log says where the time went.
# Part 1: BP and every pipeline method on ResNet-56, batch 128, one GPU
# (per-stage times and the predicted K-device speed-up; 3 interleaved rounds), the PyTorch reference of
# the same ResNet-56 step (NCHW and channels-last), then BP again. Part 2: a ResIST worker's step
# against a full-model step (ResNet-101, batch 128, S = 4, with the lax.cond variant), and the replica
# methods' throughput. Part 3: each method's peak GPU memory, every run in its own process.
# Results: $OUT/{gpu,throughput,torch,resist,replica,memory}.jsonl and $OUT/log.txt.
# Needs jax, flax, optax, orbax-checkpoint, ml_collections (installed from .whl/ when missing: see
# docs/PERFORMANCE.md) and, for the reference, PyTorch with CUDA.
set -u -o pipefail
OUT=${OUT:-benchmarks/out}
PART=${PART:-all}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SECONDS=0
stamp() { echo "[gpu_session: ${SECONDS} s] $*"; }
if ! $PY -c 'import ml_collections' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import json, jax, flax; print(json.dumps({"jax": jax.__version__, "flax": flax.__version__,
    "device": jax.devices()[0].device_kind}))' | tee "$OUT/gpu.jsonl"
  if [ "$PART" = all ] || [ "$PART" = 1 ]; then
    stamp 'part 1: the pipeline methods against BP'
    $PY benchmarks/throughput.py --model=resnet56 --batch=128 --warmup=10 --iters=10 --rounds=3 \
        --runs=bp,fdg:2:1,fdg:4:1,adl:2:1,ddg:2:1,fr:2:1,dgl:2:1 --json_out="$OUT/throughput.jsonl"
    stamp 'part 1: the PyTorch reference'
    for layout in '' --channels_last; do
      $PY benchmarks/torch_reference.py --depth=56 --batch=128 --device=cuda --warmup=10 --iters=30 \
          $layout --json_out="$OUT/torch.jsonl"
    done
    $PY benchmarks/throughput.py --model=resnet56 --batch=128 --warmup=10 --iters=30 --runs=bp \
        --json_out="$OUT/throughput.jsonl"
  fi
  if [ "$PART" = all ] || [ "$PART" = 2 ]; then
    stamp 'part 2: the ResIST worker'
    $PY benchmarks/resist_worker.py --model=preact101 --batch=128 --workers=4 --with_cond --warmup=3 --rounds=2 \
        --iters=5 --json_out="$OUT/resist.jsonl"
    stamp 'part 2: the replica methods'
    $PY benchmarks/throughput.py --model=preact101 --dataset=cifar100 --batch=128 --local_steps=10 \
        --warmup=5 --iters=20 --runs=bp,localsgd:4:1,resist:4:1 --json_out="$OUT/replica.jsonl"
  fi
  if [ "$PART" = all ] || [ "$PART" = 4 ]; then
    stamp 'part 4: the synchronous schedules beside FDG (host_share says whether the host set the pace)'
    $PY benchmarks/throughput.py --model=resnet56 --batch=128 --warmup=10 --iters=10 --rounds=2 \
        --runs=bp,fdg:2:1,fdg:4:1,gpipe:2:1,1f1b:2:1,1f1b:4:1 --host_breakdown --json_out="$OUT/sync.jsonl"
  fi
  if [ "$PART" = all ] || [ "$PART" = 3 ]; then
    stamp 'part 3: peak memory, a process per run'
    $PY benchmarks/throughput.py --model=resnet56 --batch=128 --warmup=3 --iters=3 --isolate \
        --runs=bp,fdg:2:1,fdg:4:1,ddg:2:1,fr:2:1,dgl:2:1 --json_out="$OUT/memory.jsonl"
    $PY benchmarks/throughput.py --model=resnet56 --batch=128 --warmup=3 --iters=3 --isolate \
        --keep=recompute --runs=fdg:2:1,fdg:4:1 --json_out="$OUT/memory.jsonl"
    $PY benchmarks/throughput.py --model=resnet56 --batch=128 --warmup=3 --iters=3 --isolate \
        --runs=gpipe:2:1,1f1b:2:1 --json_out="$OUT/memory.jsonl"
  fi
  stamp done
} 2>&1 | tee "$OUT/log.txt"
