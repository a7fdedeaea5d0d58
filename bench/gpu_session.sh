#!/usr/bin/env bash
# Issue 33's checks on a lent GPU machine (torch + transformers, no Ray, no vLLM), in one go: one update's
# throughput, the plain loop against tandem auto (on CUDA: varlen attention, compiled decoder layers and head
# arithmetic) and tandem auto with one setting changed per row (bench/gpu_train.py --variants: the head's
# arithmetic eager, the CPU's 220-token head chunks, eager decoder layers (is auto's torch_compile worth it?),
# Liger); then the gpu-marked tests of the attention kernels, Liger and the compiled LM head.
#   bash bench/gpu_session.sh                     # 1.5B, with a profile (about 6 minutes on an H100)
#   SIZES=1.5B,3B ATTN=auto,sdpa VARIANTS=liger bash bench/gpu_session.sh
#   TRAIN_TIMEOUT=200 TEST_TIMEOUT=90 bash bench/gpu_session.sh   # each part stopped after so many seconds
#   TESTS=0 PROFILE= bash bench/gpu_session.sh                    # no gpu-marked tests, no profile
# The wheels the machine lacks (tensordict, liger-kernel, ...) come from .wheels, made here by
# `python bench/gpu_wheels.py` and carried: bench/gpu_install.sh puts them in $SITE.
# Numbers land in $OUT (default /tmp): train.json (written after each row); the tables print as each size finishes.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp}
SITE=${SITE:-/tmp/site}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# shellcheck source=bench/gpu_install.sh
source bench/gpu_install.sh || exit 1
export PYTHONPATH=$SITE:$PWD/src
"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
timeout -k 10 "${TRAIN_TIMEOUT:-600}" "$PYTHON" bench/gpu_train.py --sizes "${SIZES:-1.5B}" --attn "${ATTN:-auto}" \
    --steps "${STEPS:-2}" ${PROFILE---profile} \
    --variants "${VARIANTS:-eager-head,head-chunk=220,eager-layers,liger}" --json "$OUT/train.json"
[[ ${TESTS:-1} == 0 ]] && exit 0  # TESTS=0: the throughput rows only
timeout -k 10 "${TEST_TIMEOUT:-300}" "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_attention.py \
    tests/engine/test_kernels.py tests/engine/test_lm_head.py tests/engine/test_compile_layers.py 2>&1 | tail -15
