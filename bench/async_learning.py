"""Do one-step-off and streaming learn as well as synchronous RL? The quickstart task, each way, several
seeds (issue 17).

    .venv/bin/python bench/async_learning.py [--seeds 0,1,2] [--modes synchronous,one_step_off,streaming]
        [--out runs/async_learning] [--steps 50]

Per seed: the quickstart's model, data and SFT warm start (tandem/commands/quickstart.py, to validation
loss 0.6), then one GRPO run per mode from that same SFT model with the quickstart's settings (32 prompts x 8
samples, 4 optimizer steps per step, lr 1e-4, a KL-loss reference, validation on the 256 held-out
additions every 10 steps, greedy):
  synchronous    the quickstart as it is: hybrid layout, 2 FSDP ranks of 1 CPU (actor + reference +
                 vLLM in each), generate then train
  one_step_off   rollout.layout=separate, 1 trainer rank of 1 CPU + 1 rollout worker of 1 CPU,
                 trainer.async_mode=one_step_off: each step trains on samples generated with the weights
                 of the step before (staleness 1), token-level TIS on (the mode's default)
  streaming      the same pools, rollout.mode=async (single turn), trainer.async_mode=streaming: prompt groups
                 generated continuously, 2 batches queued, groups over 1 update old dropped, TIS on
The synchronous and one_step_off runs see the same prompts in the same order (data.seed); streaming trains
on groups in the order they finish. Prints validation accuracy per seed and mode, the gap to synchronous
after the last step as min / median / max over seeds, and each run's wall time; writes
<out>/async_learning.png (accuracy per validation step, every mode, every seed).
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
    "streaming": [
        "rollout.layout=separate",
        "trainer.workers_per_node=1",
        "trainer.cpus_per_worker=1",
        "rollout.workers_per_node=1",
        "rollout.mode=async",
        "trainer.async_mode=streaming",
    ],
}
STYLES = {"synchronous": "-", "one_step_off": "--", "streaming": ":"}


def run_seed(out: Path, seed: int, steps: int, modes: list[str], reuse_sft: bool) -> dict[str, Any]:
    """SFT once, then GRPO in each mode from the SFT model; validation accuracy per step and wall times."""
    from tandem.commands.quickstart import ADDITION, WarmStart, prepare
    from tandem.config import load_config
    from tandem.trainer.ppo import RLTrainer

    recipe = ADDITION
    model_dir, paths = prepare(out, seed, recipe)
    sft_cfg = load_config(
        "sft", [*recipe.common, *recipe.sft, *paths, f"actor.model_path={model_dir}"], require_data=True
    )
    start = time.perf_counter()
    sft = WarmStart(sft_cfg, recipe.target_val_loss)
    if not (
        reuse_sft and (sft.hf_dir / "config.json").exists()
    ):  # --reuse-sft: this seed's earlier warm start
        sft.fit()
    result: dict[str, Any] = {"sft_seconds": time.perf_counter() - start, "modes": {}}
    for mode in modes:
        extra = MODES[mode]
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
            "dropped_groups": sum(m.get("async/dropped_groups", 0.0) for m in history),
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
        for mode, run in result["modes"].items():
            steps, acc = zip(*run["accuracy"])
            style = STYLES[mode]
            color = colors[i % len(colors)]
            axes.plot(steps, acc, style, marker="o", color=color, label=f"seed {seed}, {mode}")
    axes.set_xlabel("GRPO step")
    axes.set_ylabel("validation accuracy (256 held-out additions, greedy)")
    axes.set_title("quickstart task: synchronous -, one_step_off --, streaming :", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.savefig(png, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument(
        "--steps", type=int, default=50, help="GRPO steps per run (default 50, the quickstart's)"
    )
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {list(MODES)}")
    parser.add_argument("--out", default="runs/async_learning", help="output folder")
    parser.add_argument(
        "--reuse-sft", action="store_true", help="keep a seed's SFT model from an earlier run in --out"
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    modes = args.modes.split(",")
    if any(m not in MODES for m in modes):
        parser.error(f"--modes: {args.modes!r} must name modes of {list(MODES)}")
    out = Path(args.out)
    results = {seed: run_seed(out / f"seed{seed}", seed, args.steps, modes, args.reuse_sft) for seed in seeds}
    (out / "async_learning.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "async_learning.png")

    print(
        f"\nvalidation accuracy after SFT and after {args.steps} GRPO steps (256 held-out additions, greedy)"
    )
    print(f"{'seed':>5}{'after SFT':>11}" + "".join(f"{m:>14}{'s':>6}" for m in modes))
    # the gap to synchronous, when it ran
    gaps: dict[str, list[float]] = {m: [] for m in modes if m != "synchronous" and "synchronous" in modes}
    for seed, r in results.items():
        runs = r["modes"]
        last = {m: runs[m]["accuracy"][-1][1] for m in modes}
        for m in gaps:
            gaps[m].append(last[m] - last["synchronous"])
        cells = "".join(f"{last[m]:>14.3f}{runs[m]['seconds']:>6.0f}" for m in modes)
        print(f"{seed:>5}{runs[modes[0]]['accuracy'][0][1]:>11.3f}" + cells)
    for m, g in gaps.items():
        print(
            f"gap {m} - synchronous: min {min(g):+.3f}, median {statistics.median(g):+.3f}, max {max(g):+.3f}"
        )
    print(f"plot {out / 'async_learning.png'}")


def say(line: str) -> None:
    print(f"[async_learning] {line}", flush=True)


if __name__ == "__main__":
    main()
