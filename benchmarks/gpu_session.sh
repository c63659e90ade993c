#!/usr/bin/env bash
# One lent GPU session's checks, as a single command that ends inside its time limit:
#   1. the shared-prefix equality test (tests/models/test_logprobs.py) on CUDA, fp32, where SDPA runs other kernels;
#   2. benchmarks/gpu_throughput.py on the Qwen3-0.6B shape, bf16, GRPO and TA-GRPO, shared prefix on and off;
#   3. the colocated vLLM backend's CUDA-only checks (tests/real_engine/test_cuda.py: bf16 push read back,
#      sleep mode, tokens/s) -- only where vLLM is already installed: the lent machine cannot install it;
#   4. asynchronous rollouts against a vLLM server on the same GPU with the NCCL weight sync:
#      benchmarks/async_throughput.py, sync against rollout.async_steps=1 -- also only where vLLM is installed;
#   5. regroup's verl plug-in on the GPU: tests/verl_cpu/harness.py --gpu, DaGRPO + TA-GRPO for 3 steps under
#      verl's own CUDA platform -- only where verl 0.9.1, vLLM and TransferQueue are already installed. It has
#      never run: the lent machine has no vLLM, and wheels over 64 MiB (vLLM's among them) cannot reach it.
#
#   OUT=runs/bench/gpu bash benchmarks/gpu_session.sh
#
# Wheels under .whl/ (e.g. the transformers version this tree is tested with) are installed to /tmp/site
# first, for a machine that cannot reach a package registry. Each step writes into $OUT as it goes, so a
# step cut off by GPU_BENCH_TIMEOUT still leaves what finished.
set -uo pipefail
OUT=${OUT:-runs/bench/gpu}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
} 2>&1 | tee "$OUT/env.txt"

REGROUP_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider tests/models/test_logprobs.py \
  -k shared_prefix_equals_padded_forward 2>&1 | tail -n 25 | tee "$OUT/shared_prefix_cuda.txt"

timeout "${GPU_BENCH_TIMEOUT:-360}" python3 benchmarks/gpu_throughput.py --out "$OUT/gpu_throughput.json" \
  --shared-prefix on,off --steps 3 --warmup-steps 1 2>&1 | grep -v -E "Loading weights|Writing model" | tee "$OUT/gpu_throughput.log"

if python3 -c "import vllm" 2>/dev/null; then
  timeout "${GPU_VLLM_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider tests/real_engine/test_cuda.py 2>&1 \
    | grep -v -E "^(INFO|WARNING|\(EngineCore)" | tail -n 30 | tee "$OUT/vllm_cuda.txt"
else
  echo "vLLM is not installed on this machine: the colocated-backend CUDA checks (tests/real_engine/test_cuda.py) were not run" \
    | tee "$OUT/vllm_cuda.txt"
fi

if python3 -c "import vllm" 2>/dev/null && [ -d "${ASYNC_MODEL:-.cache/smollm2}" ]; then
  timeout "${GPU_ASYNC_TIMEOUT:-300}" python3 benchmarks/async_throughput.py --model "${ASYNC_MODEL:-.cache/smollm2}" \
    --vllm-python python3 --dtype bfloat16 --arms 0,1 --rounds 1 --steps 4 \
    --server-args "--weight-transfer-config {\"backend\":\"nccl\"} --gpu-memory-utilization 0.3" \
    --set rollout.vllm_server_sync=nccl --out "$OUT/async_nccl.json" 2>&1 \
    | grep -v -E "^(INFO|WARNING|\(EngineCore)|Loading weights|Writing model" | tail -n 20 | tee "$OUT/async_nccl.txt"
else
  echo "vLLM or the model (ASYNC_MODEL, default .cache/smollm2) is missing: the async NCCL run was not made" \
    | tee "$OUT/async_nccl.txt"
fi

if python3 -c "import verl, vllm, transfer_queue" 2>/dev/null; then
  timeout "${GPU_VERL_TIMEOUT:-420}" python3 tests/verl_cpu/harness.py --gpu --recipe dagrpo_ta --out "$OUT/verl" 2>&1 \
    | tail -n 5 | tee "$OUT/verl_gpu.txt"
  grep -E "step:[0-9]+ " "$OUT/verl/dagrpo_ta/verl.log" | tail -n 3 | cut -c1-400 >> "$OUT/verl_gpu.txt"
else
  echo "verl 0.9.1, vLLM or TransferQueue is not installed on this machine: the verl plug-in's GPU run was not made" \
    | tee "$OUT/verl_gpu.txt"
fi
