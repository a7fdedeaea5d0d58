#!/usr/bin/env bash
# Issue 33's checks on a lent GPU machine (torch + transformers, no Ray, no vLLM), in one go:
# the gpu-marked tests of the attention kernels, Liger and the compiled LM head, then one update's throughput
# per kernel, and with the head's arithmetic eager and in the CPU's 220-token chunks (the head's before / after).
#   bash bench/gpu_session.sh                     # 1.5B, attn auto and sdpa, with a profile
#   SIZES=1.5B,3B ATTN=auto,varlen,flex_attention,sdpa bash bench/gpu_session.sh
# Numbers land in $OUT (default /tmp): train.json; the tables print as each size finishes.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_attention.py tests/engine/test_kernels.py \
    tests/engine/test_lm_head.py 2>&1 | tail -15
python bench/gpu_train.py --sizes "${SIZES:-1.5B}" --attn "${ATTN:-auto,sdpa}" --steps "${STEPS:-2}" --profile --eager-head --head-chunk 220 \
    --json "$OUT/train.json"
