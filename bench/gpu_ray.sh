#!/usr/bin/env bash
# GRPO through Ray on a lent GPU machine, end to end, in one go (about 1-2 minutes on an H100, 240 s at most):
# the wheels the machine lacks installed from .wheels (made here by `python bench/gpu_wheels.py`: a slimmed
# Ray 2.60.0, jsonschema's family, tensordict, liger-kernel) into $SITE, then bench/gpu_ray.py: the tiny Qwen2,
# the grpo preset with a KL loss to the reference, trainer.backend=ray trainer.device=auto, one rank holding
# the FSDP2 actor, the hf rollout and the reference. Per step: times, rollout_mismatch/*, the worker's peak GPU
# memory; a failure prints its traceback and the workers' and Ray's log tails.
#   bash bench/gpu_ray.sh                      # carrying .wheels
#   bash bench/gpu_ray.sh rollout.n=8          # key=value overrides go to the trainer
#   PYTHON=.venv/bin/python bash bench/gpu_ray.sh   # the same run on a CPU machine (trainer.device=auto -> cpu)
# Numbers land in $OUT (default /tmp): gpu_ray.json.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp}
SITE=${SITE:-/tmp/site}
WHEELS=${WHEELS:-.wheels}
export OUT

command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# shellcheck source=bench/gpu_install.sh
source bench/gpu_install.sh || exit 1
if ! PYTHONPATH=$SITE "$PYTHON" -c "import ray, tensordict"; then
    echo "gpu_ray.sh: $PYTHON cannot import Ray or tensordict (above); are the wheels in $WHEELS?" \
        "Make them with 'python bench/gpu_wheels.py' and carry .wheels"
    exit 1
fi
export PYTHONPATH=$SITE:$PWD/src
# Ray's files (sockets, logs: $RAY_TMPDIR/ray/session_latest/logs) in a folder of this run's own
export RAY_TMPDIR=${RAY_TMPDIR:-/tmp/tandem-gpu-ray-tmp}
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
"$PYTHON" - << 'EOF'
import importlib.metadata as md
import sys

import torch

cuda = torch.cuda.is_available()
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| available:", cuda, "|", torch.cuda.get_device_name(0) if cuda else "no GPU")
for name in ("transformers", "ray", "tensordict", "jsonschema", "liger-kernel", "peft", "numpy", "protobuf"):
    try:
        print(f"  {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name} MISSING")
EOF
WORK=$(mktemp -d /tmp/tandem-gpu-ray-XXXXXX)  # the model, the data, the run folder (its logs/: the workers')
timeout -k 15 "${TIMEOUT:-240}" "$PYTHON" bench/gpu_ray.py --out "$OUT" --workdir "$WORK" "$@"
rc=$?
logs=$RAY_TMPDIR/ray/session_latest/logs
if ((rc == 124 || rc == 137)); then
    echo "gpu_ray.sh: stopped after ${TIMEOUT:-240} s; the log tails of the workers and of Ray:"
    find "$WORK" -name '*.log' -exec sh -c 'echo "---- $1"; tail -n 40 "$1"' _ {} \; 2> /dev/null
    for f in "$logs"/raylet.out "$logs"/gcs_server.out $(ls -t "$logs"/python-core-worker-*.log 2> /dev/null | head -2) \
        $(find "$logs" -name '*.err' -size +0 2> /dev/null); do
        echo "---- $f"
        tail -n 25 "$f"
    done
fi
# Ray's processes die with the driver (kernel fate sharing); any left of this run's Ray (its own RAY_TMPDIR),
# e.g. holding the GPU after a timeout, are stopped here by their ids
leftover=$(pgrep -f -- "$RAY_TMPDIR/ray/session_" || true)
if [[ -n $leftover ]]; then
    echo "gpu_ray.sh: stopping this run's leftover Ray processes:" $leftover
    kill -9 $leftover 2> /dev/null || true
fi
echo "gpu_ray.sh: exit $rc; report in $OUT/gpu_ray.json"
exit $rc
