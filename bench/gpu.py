"""GPU paths of W1: a GRPO step on one CUDA device, in process (no Ray, no vLLM), every engine and dtype.

    python bench/gpu.py [--steps 3] [--json gpu.json]
    python bench/gpu.py train [--sizes 0.5B,1.5B,3B] ...   (one update's throughput: bench/gpu_train.py)

Written for the lent GPU machine, which has torch and transformers but neither Ray nor vLLM (DESIGN.md):
the trainer runs with `trainer.backend=inprocess trainer.device=cuda rollout.engine=hf`. Each configuration
is W1 of `grpo_w1.py` (32 prompts x 8 samples, <= 64 tokens, no reference unless the row says so), one
warm-up step and `--steps` measured ones, in a child process of its own (megatron's parallel state is
process-wide). Per row: the median step and its phases, the trainer's own perf/mfu/actor (model FLOPs of
the update over the step's update time and the GPU's peak in the engine's dtype, engine/flops.py), peak
GPU memory, the mean score, and the largest |rollout - trainer| log-prob ratio seen (rollout_mismatch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import gpu_train
from grpo_w1 import SIZES, VARIANTS, Workload, model_numbers, prepare, say, summarise

CUDA = ["trainer.backend=inprocess", "trainer.device=cuda", "rollout.engine=hf", "trainer.cpus_per_worker=4"]
BF16 = ["actor.fsdp.param_dtype=bfloat16"]
DENSE = {  # label: overrides, on W1's dense model
    "fsdp2 fp32": ["actor.fsdp.param_dtype=float32"],
    "fsdp2 bf16": BF16,
    "fsdp2 bf16, kl-ref": [*BF16, *VARIANTS["kl-ref"]],
    "fsdp2 bf16, critic (gae)": [*BF16, "algorithm.adv_estimator=gae", "critic.optim.lr=1e-5"],
    "fsdp2 bf16, LoRA r8 + kl-ref": [*BF16, *VARIANTS["kl-ref"], "actor.lora.rank=8"],
    "megatron bf16": ["actor.strategy=megatron", "actor.megatron.param_dtype=bfloat16"],
}
MOE = {"fsdp2 bf16, MoE 4x2": BF16, "megatron bf16, MoE 4x2": DENSE["megatron bf16"]}
MOE_MODEL = {"num_experts": 4, "experts_per_token": 2}


def row(run: dict[str, Any], folder: Path) -> dict[str, float]:
    s = summarise(run, model_numbers(folder), None)
    measured = run["steps"][1:]

    def median(key: str) -> float:
        values = [m[key] for m in measured if key in m]
        return statistics.median(values) if values else float("nan")

    mismatch = [
        max(m.get("rollout_mismatch/max_ratio", 1.0), 1 / m.get("rollout_mismatch/min_ratio", 1.0))
        for m in measured
    ]
    return {
        "step": s["step"],
        "generate": s["generate"],
        "train": s["train"],
        "sync": s["weight_sync"],
        "mfu_actor": median("perf/mfu/actor"),
        "peak_gib": max(m.get("memory/peak_allocated_gib", float("nan")) for m in run["steps"]),
        "score": median("score/mean"),
        "max_ratio": max(mismatch),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="measured steps per configuration")
    parser.add_argument("--json", help="also write every number to this file (after each configuration)")
    parser.add_argument(
        "--only", default="", help="comma-separated substrings: run the configurations they match"
    )
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/gpu.py needs a CUDA device (the CPU numbers are grpo_w1.py's)")
    say(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    from tandem.models.tiny import save_tiny

    work = Workload(steps=args.steps)
    workdir = Path(tempfile.mkdtemp(prefix="tandem-gpu-"))
    runner = prepare(workdir)
    moe_folder = save_tiny(workdir / "moe-model", **MOE_MODEL)
    big = next(size for size in SIZES if size.startswith("100M"))
    big_folder = save_tiny(workdir / "model-100M", **SIZES[big])
    # W1's step on Qwen2.5-0.5B's shape (random weights, the real vocabulary): the update's share of a step
    qwen_folder = save_tiny(workdir / "model-0.5B", vocab_size=gpu_train.VOCAB, **gpu_train.SHAPES["0.5B"])
    plan = [(label, runner.folder, extra) for label, extra in DENSE.items()]
    plan += [(label, moe_folder, extra) for label, extra in MOE.items()]
    plan += [
        (f"{big}, fsdp2 {dtype}", big_folder, [f"actor.fsdp.param_dtype={dtype}"])
        for dtype in ("float32", "bfloat16")
    ]
    plan.append(("Qwen2.5-0.5B shape, fsdp2 bf16", qwen_folder, BF16))
    if args.only:
        plan = [p for p in plan if any(part in p[0] for part in args.only.split(","))]
    rows: dict[str, dict[str, float]] = {}
    failed: dict[str, str] = {}
    for label, folder, extra in plan:
        name = "gpu/" + label.replace(" ", "-").replace(",", "").replace("+", "")
        runner.folder = folder
        try:
            run = runner.tandem(name, work, [*VARIANTS["no-ref"], *CUDA, *extra])
        except SystemExit as error:  # one configuration's failure is a row of the report, not the end of it
            failed[label] = str(error)[-3000:]
            say(f"{label} FAILED:\n{failed[label]}")
            continue
        rows[label] = row(run, folder)
        say(f"{label}: " + ", ".join(f"{k} {v:.4g}" for k, v in rows[label].items()))
        if args.json:
            Path(args.json).write_text(json.dumps({"rows": rows, "failed": failed}, indent=1))
    print(f"\nW1 on {torch.cuda.get_device_name()} ({work.label()}, 1 warm-up + {work.steps} measured steps)")
    header = ["step s", "gen s", "train s", "sync s", "MFU actor", "peak GiB", "score", "max ratio"]
    print(f"{'config':<34}" + "".join(f"{h:>11}" for h in header))
    for label, r in rows.items():
        cells = [
            r["step"],
            r["generate"],
            r["train"],
            r["sync"],
            r["mfu_actor"],
            r["peak_gib"],
            r["score"],
            r["max_ratio"],
        ]
        print(f"{label:<34}" + "".join(f"{c:>11.4f}" for c in cells))
    for label in failed:
        print(f"{label:<34}failed (above)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["train"]:  # the training-throughput section: bench/gpu_train.py, its own arguments
        sys.argv.pop(1)
        import gpu_train

        gpu_train.main()
    else:
        main()
