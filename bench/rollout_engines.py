"""Rollout engines side by side on the same prompts, in one process: start-up, weight sync, tokens/s.

    .venv/bin/python bench/rollout_engines.py [--prompts 32] [--samples 8] [--tokens 64] [--repeats 3]

The tiny Qwen2 of the quickstart (random weights, fp32, CPU), prompts "a+b=" with a, b in [0, 99].
Prints one row per engine: start-up seconds, weight-sync seconds (the full model streamed in from a
training copy, median), and generated tokens per second (median of the timed repeats after one warm-up).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM

from tandem.data.prompts import collate_prompts
from tandem.models.tiny import build_tokenizer, save_tiny
from tandem.rollout import SamplingParams, build_rollout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default="hf,vllm")
    args = parser.parse_args()

    torch.manual_seed(0)
    folder = save_tiny(tempfile.mkdtemp(prefix="tandem-bench-") + "/model")
    tokenizer = build_tokenizer()
    rng = random.Random(0)
    items = []
    for i in range(args.prompts):
        text = f"{rng.randrange(100)}+{rng.randrange(100)}="
        items.append(
            {
                "input_ids": tokenizer(text)["input_ids"],
                "raw_prompt": [{"role": "user", "content": text}],
                "data_source": "addition",
                "ground_truth": "",
                "extra_info": {},
                "index": i,
            }
        )
    prompts = collate_prompts(items, tokenizer.pad_token_id)
    trainer_copy = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    sampling = SamplingParams(max_tokens=args.tokens, n=args.samples, temperature=1.0, seed=1)

    print(
        f"{args.prompts} prompts x {args.samples} samples x <= {args.tokens} tokens, torch threads {torch.get_num_threads()}"
    )
    print(f"{'engine':<8}{'start s':>10}{'sync s':>10}{'tokens':>10}{'tokens/s':>12}")
    for name in args.engines.split(","):
        start = time.perf_counter()
        engine = (
            build_rollout(name, model_path=folder, max_model_len=32 + args.tokens)
            if name == "vllm"
            else build_rollout(name, model_path=folder)
        )
        started = time.perf_counter() - start
        syncs = []
        for _ in range(3):
            start = time.perf_counter()
            engine.update_weights((n, p.detach()) for n, p in trainer_copy.named_parameters())
            syncs.append(time.perf_counter() - start)
        engine.generate(prompts, sampling)  # warm-up
        rates, tokens = [], 0
        for _ in range(args.repeats):
            start = time.perf_counter()
            out = engine.generate(prompts, sampling)
            seconds = time.perf_counter() - start
            tokens = int(out["response_mask"].sum())
            rates.append(tokens / seconds)
        print(
            f"{name:<8}{started:>10.1f}{statistics.median(syncs):>10.3f}{tokens:>10}{statistics.median(rates):>12.0f}"
        )


if __name__ == "__main__":
    main()
