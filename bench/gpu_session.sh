#!/usr/bin/env bash
# Issue 33's checks on a lent GPU machine (torch + transformers, no Ray, no vLLM), in one go:
# the gpu-marked tests of the attention kernels, Liger and the compiled LM head, then one update's throughput:
# the plain loop, tandem auto (on CUDA: varlen attention, compiled decoder layers and head arithmetic), and tandem
# auto with one setting changed per row (bench/gpu_train.py --variants): the head's arithmetic eager, the CPU's
# 220-token head chunks, eager decoder layers (is auto's torch_compile worth it?), Liger.
#   bash bench/gpu_session.sh                     # 1.5B, with a profile (about 6 minutes on an H100)
#   SIZES=1.5B,3B ATTN=auto,sdpa VARIANTS=liger bash bench/gpu_session.sh
# Liger needs its wheel: `python bench/gpu_wheels.py` here puts it in .wheels (ignored), with tensordict and the
# slimmed Ray of bench/gpu_ray.sh; carry `.wheels`.
# Numbers land in $OUT (default /tmp): train.json; the tables print as each size finishes.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if compgen -G ".wheels/*.whl" > /dev/null; then python -m pip install -q --no-deps .wheels/*.whl; fi
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_attention.py tests/engine/test_kernels.py \
    tests/engine/test_lm_head.py tests/engine/test_compile_layers.py 2>&1 | tail -15
python bench/gpu_train.py --sizes "${SIZES:-1.5B}" --attn "${ATTN:-auto}" --steps "${STEPS:-2}" --profile \
    --variants "${VARIANTS:-eager-head,head-chunk=220,eager-layers,liger}" \
    --json "$OUT/train.json"
