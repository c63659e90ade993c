#!/usr/bin/env bash
# The gated miniature study (studies/gated.py) on one GPU machine, as one command that ends inside its limit:
#
#   OUT=runs/gated-gpu STUDY=runs/gated-2026-12-04 bash studies/gated_gpu.sh
#
# STUDY is a study folder holding its plan.json and regime.json (`python -m studies --gated STUDY` writes
# them; the regime's warm start, e.g. runs/warmup-early420, must be on this machine too). First the gate:
# one process per rate. Then the primaries: one process per (seed, arm), WORKERS at a time, seeds as the outer
# loop; each process is refused (exit 2) unless the gate is met, and none starts after BUDGET_S seconds, so
# what is cut off is whole seeds at the end. Every process trains and evaluates on the GPU. Every 20 s the
# runs' records (no checkpoints) are packed into $OUT/gated.tgz, so a command stopped at its limit still
# returns what finished. Wheels under .whl/ (pydantic, the transformers this tree is tested with) are
# installed to /tmp/site first, for a machine that cannot reach a package registry.
set -uo pipefail
OUT=${OUT:?set OUT}
STUDY=${STUDY:?set STUDY}
WORKERS=${WORKERS:-10}
SEEDS=${SEEDS:-10}
BUDGET_S=${BUDGET_S:-480}
ARMS=${ARMS:-grpo grpo_drgrpo dagrpo_anchor_nc grpo_matched ta_grpo}
T0=$(date +%s)
mkdir -p "$OUT" "$STUDY/logs"
OUT=$(cd "$OUT" && pwd)
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 USE_HUB_KERNELS=NO  # no kernel downloads from the Hub: nothing can be fetched
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers, pydantic; print('torch', torch.__version__, 'transformers', transformers.__version__, 'pydantic', pydantic.__version__, torch.cuda.get_device_name(0))"
  echo "cores $(nproc)"
} 2>&1 | tee "$OUT/env.txt"

pack() {  # the runs' small files (plan, metrics, evaluations, timing, logs): what the kept table is built from
  (cd "$STUDY" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.yaml' -o -name '*.log' \) \
    ! -path '*/checkpoints/*' -print0 | tar --null -czf "$OUT/gated.tmp.tgz" -T -) \
    && mv "$OUT/gated.tmp.tgz" "$OUT/gated.tgz"
}
( while sleep 20; do pack; done ) &
PACKER=$!

# MPS lets the processes' small kernels share the GPU instead of taking turns; without it they still run.
if [ "${MPS:-1}" = 1 ] && command -v nvidia-cuda-mps-control >/dev/null; then
  nvidia-cuda-mps-control -d 2>&1 | tee -a "$OUT/env.txt"
  if ! timeout 90 python3 -c "import torch; x = torch.ones(64, device='cuda'); print('MPS on:', float(x.sum()))" 2>&1 | tee -a "$OUT/env.txt"; then
    echo quit | nvidia-cuda-mps-control; echo "MPS off: a CUDA check failed under it" | tee -a "$OUT/env.txt"
  fi
fi

GATE_PIDS=()
for rate in 1e-4 3e-4; do
  python3 -m studies --gated "$STUDY" --rates "$rate" >"$STUDY/logs/gate-$rate.log" 2>&1 &
  GATE_PIDS+=($!)
done
wait "${GATE_PIDS[@]}"
grep -h "step 96" "$STUDY"/logs/gate-*.log | tee "$OUT/gate.txt"
echo "gate done at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/gate.txt"

export STUDY T0 BUDGET_S
for seed in $(seq 0 $((SEEDS - 1))); do for arm in $ARMS; do echo "$seed $arm"; done; done \
  | xargs -P "$WORKERS" -L 1 sh -c '
      [ $(( $(date +%s) - T0 )) -lt "$BUDGET_S" ] || { echo "seed $0 $1: not started (budget)"; exit 0; }
      python3 -m studies --gated "$STUDY" --first-seed "$0" --seeds 1 --arms "$1" >"$STUDY/logs/s$0-$1.log" 2>&1
      echo "seed $0 $1: exit $? at $(( $(date +%s) - T0 )) s"' | tee "$OUT/workers.txt"

kill "$PACKER" 2>/dev/null
pack
echo "all done at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/workers.txt"
