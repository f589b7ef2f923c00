#!/usr/bin/env bash
# The checks a CUDA machine runs for docs/gpu.md, in one go, each part under its own time limit:
#   1. the machine (nvidia-smi, PyTorch, transformers)
#   2. tests/test_cuda.py and the CUDA cases of tests/nn/test_one_forward.py and test_flex_attention.py (skipped
#      on a machine without a GPU); they compile and capture decoding steps (static cache, the engine), which
#      takes a minute or two of the part's time
#   3. benchmarks/gpu_speed.py: tformer beside Hugging Face on the GPU, issue 58's parts first (the encoder last)
#   4. the whole test suite there (pytest-xdist across the machine's cores, when it is installed), only when its
#      seconds are given: parts 2 and 3 fill the 8 minutes issue 58 allows the call by default
# Logs go to $LOGS (default: logs-gpu/). Wheels in .whl/ (packages the image lacks; tools/gpu_wheels.sh
# downloads them) are installed first.
#     bash tools/gpu_check.sh [TEST_SECONDS BENCH_SECONDS SUITE_SECONDS]     # defaults 180 300 0
set -u
LOGS=${LOGS:-logs-gpu}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__, 'gpu', torch.cuda.get_device_name())"
    nproc; g++ --version | head -1
} 2>&1 | tee "$LOGS/machine.txt"

echo "== CUDA tests"
timeout "${1:-180}" python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/nn/test_one_forward.py \
    tests/nn/test_flex_attention.py -k "cuda" \
    2>&1 | tee "$LOGS/cuda_tests.txt" | tail -25

echo "== benchmarks/gpu_speed.py"
timeout "${2:-300}" python3 benchmarks/gpu_speed.py --parts ceilings decode batch train attention encoder 2>&1 | tee "$LOGS/gpu_speed.txt" | grep -v "^round \|shards"

if [ "${3:-0}" = 0 ]; then
    echo "== the whole suite: not run (give its seconds as the third argument)"
    exit 0
fi
echo "== the whole suite"
workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n $(( $(nproc) - 2 ))")
timeout "${3}" python3 -m pytest -v -rfE -p no:cacheprovider $workers tests 2>&1 | tee "$LOGS/suite.txt" \
    | grep -E "^(FAILED|ERROR)|^\[gw[0-9]+\].* (FAILED|ERROR) |passed|failed" | tail -60
