"""A long-tail workload (issue 17): most responses short, a few at the cap, where synchronous RL leaves
cores idle; the colocated default against the separate rollout pool, synchronous and one-step-off.

    .venv/bin/python bench/long_tail.py [--steps 5] [--cap 192] [--long-share 0.15] [--json PATH]

The model: W1's tiny Qwen2 (bench/grpo_w1.py, same tokenizer and prompts "a+b="), first taught in this
process (plain PyTorch, AdamW, seeded, --teach-steps steps) to answer either with digits and EOS or, for a
share --long-share of the answers, with a run of "." that never ends. Sampled at temperature 1 by the
rollout, most responses are a few tokens and about that share run to the cap; each table row prints the
lengths the run saw (mean, and the share that hit the cap). The GRPO run is W1's (no reference, one
optimizer step per step, lr 1e-5, 32 prompts x 8 samples) with data.max_response_length = --cap.

Each configuration trains in a child process of its own (grpo_w1's runner): 1 warm-up step, then --steps
measured ones, medians over those. samples/s = samples per step / timing_s/step_wall (the controller's
clock from the step's start to the workers' report, which waits for a generation in flight).
  hybrid, 1 rank of 2 CPUs       the colocated default (as W1's main run)
  hybrid, 2 ranks of 1 CPU       the colocated default on 2 FSDP ranks
  separate, synchronous          1 trainer rank of 1 CPU + 1 rollout worker of 1 CPU
  separate, one_step_off         the same pools; step k+1's generation overlaps step k's update
  separate, streaming            the same pools; prompt groups generated continuously (2 batches queued)
With 2 cores the separate layout has one split (1 + 1). The target (issue 17): one_step_off and
streaming reach >= 1.3x the samples/s of the best hybrid row.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_w1 import VARIANTS, Workload, prepare, say

FILLER = "."
TEACH_BATCH = 48
TEACH_LR = 3e-3
CONFIGS = {
    "hybrid, 1 rank of 2 CPUs": (1, []),
    "hybrid, 2 ranks of 1 CPU": (2, []),
    "separate, synchronous": (1, ["rollout.layout=separate", "trainer.cpus_per_worker=1"]),
    "separate, one_step_off": (
        1,
        ["rollout.layout=separate", "trainer.cpus_per_worker=1", "trainer.async_mode=one_step_off"],
    ),
    "separate, streaming": (
        1,
        [
            "rollout.layout=separate",
            "trainer.cpus_per_worker=1",
            "rollout.mode=async",
            "trainer.async_mode=streaming",
        ],
    ),
}
TARGET = 1.3


def teach_long_tail(folder: Path, prompts: list[str], cap: int, long_share: float, steps: int) -> dict:
    """Train the model in `folder` (in place) to answer a prompt with its sum + EOS, or, for a share
    `long_share` of the answers, with `cap` filler tokens and no EOS. Returns the last losses."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    rng = random.Random(0)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=TEACH_LR)
    eos = tokenizer.eos_token_id
    filler = tokenizer.encode(FILLER, add_special_tokens=False)
    if len(filler) != 1:
        raise SystemExit(f"the filler {FILLER!r} is {len(filler)} tokens in this tokenizer, expected 1")
    n_long = max(1, round(long_share * TEACH_BATCH))

    def rows(n: int, long: bool) -> tuple[Any, Any, Any]:
        """input ids, attention mask, labels (-100 on the prompt and padding), right-padded."""
        sequences = []
        for _ in range(n):
            prompt = rng.choice(prompts)
            a, b = (int(x) for x in prompt.rstrip("=").split("+"))
            target = filler * cap if long else [*tokenizer.encode(str(a + b), add_special_tokens=False), eos]
            ids = tokenizer.encode(prompt, add_special_tokens=False)
            sequences.append((ids + target, [-100] * len(ids) + target))
        width = max(len(ids) for ids, _ in sequences)
        pad = tokenizer.pad_token_id
        ids = torch.tensor([s + [pad] * (width - len(s)) for s, _ in sequences])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s, _ in sequences])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in sequences])
        return ids, mask, labels

    losses = []
    model.train()
    for _ in range(steps):
        total, tokens = 0.0, 0
        for n, long in ((TEACH_BATCH - n_long, False), (n_long, True)):
            ids, mask, labels = rows(n, long)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
            target = labels[:, 1:]
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum"
            )
            total, tokens = total + loss, tokens + int((target != -100).sum())
        (total / tokens).backward()  # a token mean: each answer's first token counts once, so the
        optimizer.step()  # share of filler answers is what the model learns to sample
        optimizer.zero_grad()
        losses.append(float(total.detach()) / tokens)
    model.save_pretrained(folder, safe_serialization=True)
    return {"teach_loss_last": statistics.mean(losses[-10:]), "teach_steps": steps}


def summarise(run: dict[str, Any], cap: int) -> dict[str, float]:
    measured = run["steps"][1:]
    wall = statistics.median(m["timing_s/step_wall"] for m in measured)
    # the trainer's wait for samples: the whole generation when synchronous, what overlap left of it else
    waits = [m.get("timing_s/wait_generate", m.get("timing_s/generate", 0.0)) for m in measured]
    return {
        "step_wall": wall,
        "samples_per_s": statistics.median(m["perf/samples"] for m in measured) / wall,
        "wait_generate": statistics.median(waits),
        "update": statistics.median(m.get("timing_s/update_actor", 0.0) for m in measured),
        "weight_sync": statistics.median(m.get("timing_s/weight_sync", 0.0) for m in measured),
        "length_mean": statistics.median(m["response_length/mean"] for m in measured),
        "at_cap": statistics.median(m["response_length/clip_ratio"] for m in measured),
        "staleness": statistics.median(m.get("async/staleness_mean", 0.0) for m in measured),
        "dropped_groups": sum(m.get("async/dropped_groups", 0.0) for m in measured),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="measured steps after 1 warm-up step")
    parser.add_argument("--cap", type=int, default=192, help="data.max_response_length (default 192)")
    parser.add_argument("--long-share", type=float, default=0.15, help="share of answers taught to run on")
    parser.add_argument("--teach-steps", type=int, default=150)
    parser.add_argument("--configs", default="; ".join(CONFIGS), help="any of: " + "; ".join(CONFIGS))
    parser.add_argument("--json", help="also write every number to this file")
    args = parser.parse_args()
    if args.steps < 1 or not 0 < args.long_share < 1 or args.cap < 8:
        parser.error("need --steps >= 1, 0 < --long-share < 1 and --cap >= 8")
    chosen = [name for name in CONFIGS if name in args.configs]  # the labels hold commas
    if not chosen:
        parser.error(f"--configs: {args.configs!r} names none of {list(CONFIGS)}")
    work = Workload(steps=args.steps, tokens=args.cap)

    workdir = Path(tempfile.mkdtemp(prefix="tandem-tail-"))
    say(f"work folder {workdir}")
    runner = prepare(workdir)
    say(f"teaching the long tail ({args.long_share:.0%} of answers run to the cap of {args.cap}) ...")
    taught = teach_long_tail(runner.folder, runner.prompts, args.cap, args.long_share, args.teach_steps)
    say(f"taught: loss {taught['teach_loss_last']:.3f} over the last 10 of {args.teach_steps} steps")
    results: dict[str, Any] = {"args": vars(args), **taught, "runs": {}, "table": {}}
    for label in chosen:
        ranks, extra = CONFIGS[label]
        name = "tail/" + label.replace(" ", "-").replace(",", "")
        run = runner.tandem(name, replace(work, ranks=ranks), [*VARIANTS["no-ref"], *extra])
        results["runs"][name] = run
        results["table"][label] = summarise(run, args.cap)
    table = results["table"]
    hybrids = [r["samples_per_s"] for label, r in table.items() if label.startswith("hybrid")]
    base = max(hybrids) if hybrids else None
    print(
        f"\nlong tail (cap {args.cap}, {args.long_share:.0%} taught to run on; no-ref, 32 x 8 samples, "
        f"1 warm-up + {args.steps} measured steps; medians)"
    )
    head = ("wall s", "samples/s", "x best hyb", "wait gen s", "update s", "sync s", "len mean", "at cap")
    print(f"{'configuration':<30}" + "".join(f"{h:>11}" for h in head))
    for label, r in table.items():
        r["x_best_hybrid"] = r["samples_per_s"] / base if base else float("nan")
        cells = (r["step_wall"], r["samples_per_s"], r["x_best_hybrid"], r["wait_generate"], r["update"])
        cells += (r["weight_sync"], r["length_mean"], r["at_cap"])
        print(f"{label:<30}" + "".join(f"{v:>11.3f}" for v in cells))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
        say(f"numbers in {args.json}")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
