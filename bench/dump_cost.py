"""What a sample dump (trainer.rollout_data_dir) costs on a W1-sized step, in process, no Ray or vLLM.

    .venv/bin/python bench/dump_cost.py [--repeats 20]

The batch has W1's shape (bench/grpo_w1.py): 32 prompts "a+b=" x 8 samples, responses of up to 64 tokens
(random lengths 16-64), the tiny byte-level tokenizer. Two numbers per case, medians over --repeats:
  step part     SampleDumps.train: copying the columns and queuing the job (timing_s/dump; the step waits)
  writer        the background job: decoding the texts, building the rows, writing <step>.jsonl
Cases: without trainer log-probs (W1's default: one optimizer step, no old-log-prob pass) and with them
(each row also gets its tokens and per-token mismatch: the heaviest rows). The writer runs while the
next step generates and trains on the workers; on W1 a step is ~5.9 s (bench/README.md), so the writer's
share of one controller core is writer / step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from tandem.batch import Batch
from tandem.config.schema import TandemConfig
from tandem.models.tiny import build_tokenizer
from tandem.trainer.dumps import SampleDumps, sample_rows, write_jsonl

PROMPTS, SAMPLES, TOKENS, PROMPT_WIDTH = 32, 8, 64, 8


def w1_batch(log_probs: bool, seed: int = 0) -> Batch:
    """A scored W1-shaped step: left-padded prompts, right-padded responses, advantages, log-probs."""
    g = torch.Generator().manual_seed(seed)
    n = PROMPTS * SAMPLES
    prompts = torch.randint(4 + 48, 4 + 58, (n, PROMPT_WIDTH), generator=g)  # digits
    prompt_mask = torch.ones(n, PROMPT_WIDTH, dtype=torch.long)
    prompt_mask[:, :2] = 0
    lengths = torch.randint(16, TOKENS + 1, (n,), generator=g)
    response_mask = (torch.arange(TOKENS) < lengths[:, None]).long()
    responses = torch.randint(4 + 32, 4 + 127, (n, TOKENS), generator=g) * response_mask
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "score": torch.randint(0, 2, (n,), generator=g).float(),
        "advantages": torch.randn(n, TOKENS, generator=g),
        "rollout_log_probs": -torch.rand(n, TOKENS, generator=g),
    }
    if log_probs:
        tensors["old_log_probs"] = tensors["rollout_log_probs"] + 1e-3 * torch.randn(n, TOKENS, generator=g)
    extra = [{"acc": float(s), "pred": "12"} for s in tensors["score"].tolist()]
    uids = [f"1.0.{i // SAMPLES}" for i in range(n)]
    non_tensors = {
        "data_source": ["addition"] * n,
        "ground_truth": ["12"] * n,
        "uid": uids,
        "reward_extra": extra,
    }
    return Batch.from_dict(tensors, non_tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    tokenizer = build_tokenizer()
    print(
        f"W1-sized step: {PROMPTS} prompts x {SAMPLES} samples, <= {TOKENS} response tokens; medians of {args.repeats}"
    )
    print(f"{'case':<28}{'step part ms':>14}{'writer ms':>12}{'file KiB':>10}")
    for label, log_probs in (("no trainer log-probs", False), ("with trainer log-probs", True)):
        batch = w1_batch(log_probs)
        with tempfile.TemporaryDirectory() as folder:
            cfg = TandemConfig()
            cfg.data.max_response_length = TOKENS
            cfg.trainer.rollout_data_dir = str(Path(folder) / "rollouts")
            dumps = SampleDumps(cfg, tokenizer)
            step_part, writer = [], []
            for step in range(1, args.repeats + 1):
                step_part.append(dumps.train(step, batch)["timing_s/dump"])
                dumps.close()  # wait, so the writer's own time is measured alone below
                start = time.perf_counter()
                rows = sample_rows(
                    batch, step, tokenizer, max_response_length=TOKENS, trainer_log_probs=log_probs
                )
                write_jsonl(Path(folder) / "again.jsonl", rows)
                writer.append(time.perf_counter() - start)
            size = (Path(folder) / "rollouts" / "1.jsonl").stat().st_size / 1024
        cells = f"{1e3 * statistics.median(step_part):>14.2f}{1e3 * statistics.median(writer):>12.1f}{size:>10.0f}"
        print(f"{label:<28}{cells}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
