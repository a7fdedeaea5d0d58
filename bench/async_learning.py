"""Does one-step-off learn as well as synchronous RL? The quickstart task, both ways, several seeds (issue 17).

    .venv/bin/python bench/one_step_off_learning.py [--seeds 0,1,2] [--out runs/one_step_off] [--steps 50]

Per seed: the quickstart's model, data and SFT warm start (tandem/trainer/quickstart.py, to validation
loss 0.6), then two GRPO runs from that same SFT model with the quickstart's settings (32 prompts x 8
samples, 4 optimizer steps per step, lr 1e-4, a KL-loss reference, validation on the 256 held-out
additions every 10 steps, greedy):
  synchronous    the quickstart as it is: hybrid layout, 2 FSDP ranks of 1 CPU (actor + reference +
                 vLLM in each), generate then train
  one_step_off   rollout.layout=separate, 1 trainer rank of 1 CPU + 1 rollout worker of 1 CPU,
                 trainer.async_mode=one_step_off: each step trains on samples generated with the weights
                 of the step before (staleness 1), token-level TIS on (the mode's default)
Both runs see the same prompts in the same order (data.seed), so they differ by the staleness, the
TIS weights and the sampling noise. Prints validation accuracy per seed and mode, the gap (one_step_off
minus synchronous) after the last step as min / median / max over seeds, and each run's wall time;
writes <out>/one_step_off_learning.png (accuracy per validation step, both modes, every seed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

MODES = {
    "synchronous": [],
    "one_step_off": [
        "rollout.layout=separate",
        "trainer.workers_per_node=1",
        "trainer.cpus_per_worker=1",
        "rollout.workers_per_node=1",
        "trainer.async_mode=one_step_off",
    ],
}


def run_seed(out: Path, seed: int, steps: int) -> dict[str, Any]:
    """SFT once, then GRPO in each mode from the SFT model; validation accuracy per step and wall times."""
    from tandem.config import load_config
    from tandem.trainer.ppo import RLTrainer
    from tandem.trainer.quickstart import ADDITION, WarmStart, prepare

    recipe = ADDITION
    model_dir, paths = prepare(out, seed, recipe)
    sft_cfg = load_config(
        "sft", [*recipe.common, *recipe.sft, *paths, f"actor.model_path={model_dir}"], require_data=True
    )
    start = time.perf_counter()
    sft = WarmStart(sft_cfg, recipe.target_val_loss)
    sft.fit()
    result: dict[str, Any] = {"sft_seconds": time.perf_counter() - start, "modes": {}}
    for mode, extra in MODES.items():
        overrides = [
            *recipe.common,
            *recipe.grpo,
            *paths,
            f"actor.model_path={sft.hf_dir}",
            f"trainer.total_training_steps={steps}",
            f"trainer.experiment_name=grpo-{mode}",
            "trainer.loggers=[jsonl]",
            *extra,
        ]
        start = time.perf_counter()
        history = RLTrainer(load_config("grpo", overrides, require_data=True)).fit()
        result["modes"][mode] = {
            "seconds": time.perf_counter() - start,
            "accuracy": [(m["step"], m["val/acc"]) for m in history if "val/acc" in m],
            "staleness": [m["async/staleness_mean"] for m in history if "async/staleness_mean" in m],
        }
        say(
            f"seed {seed} {mode}: " + "  ".join(f"{s}: {a:.3f}" for s, a in result["modes"][mode]["accuracy"])
        )
    return result


def plot(results: dict[int, dict[str, Any]], png: Path) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.subplots()
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
    for i, (seed, result) in enumerate(results.items()):
        for mode, style in (("synchronous", "-"), ("one_step_off", "--")):
            steps, acc = zip(*result["modes"][mode]["accuracy"])
            color = colors[i % len(colors)]
            axes.plot(steps, acc, style, marker="o", color=color, label=f"seed {seed}, {mode}")
    axes.set_xlabel("GRPO step")
    axes.set_ylabel("validation accuracy (256 held-out additions, greedy)")
    axes.set_title("quickstart task: synchronous (solid) vs one_step_off (dashed)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.savefig(png, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument(
        "--steps", type=int, default=50, help="GRPO steps per run (default 50, the quickstart's)"
    )
    parser.add_argument("--out", default="runs/one_step_off", help="output folder")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    results = {seed: run_seed(out / f"seed{seed}", seed, args.steps) for seed in seeds}
    (out / "one_step_off_learning.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "one_step_off_learning.png")

    print(
        f"\nvalidation accuracy after SFT and after {args.steps} GRPO steps (256 held-out additions, greedy)"
    )
    print(
        f"{'seed':>5}{'after SFT':>11}{'synchronous':>13}{'one_step_off':>14}{'gap':>8}{'sync s':>9}{'oso s':>9}"
    )
    gaps = []
    for seed, r in results.items():
        sync, off = r["modes"]["synchronous"], r["modes"]["one_step_off"]
        first, last_sync, last_off = sync["accuracy"][0][1], sync["accuracy"][-1][1], off["accuracy"][-1][1]
        gaps.append(last_off - last_sync)
        print(
            f"{seed:>5}{first:>11.3f}{last_sync:>13.3f}{last_off:>14.3f}{gaps[-1]:>+8.3f}"
            f"{sync['seconds']:>9.0f}{off['seconds']:>9.0f}"
        )
    print(
        f"gap one_step_off - synchronous: min {min(gaps):+.3f}, median {statistics.median(gaps):+.3f}, "
        f"max {max(gaps):+.3f}; plot {out / 'one_step_off_learning.png'}"
    )


def say(line: str) -> None:
    print(f"[one_step_off] {line}", flush=True)


if __name__ == "__main__":
    main()
