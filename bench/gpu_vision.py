"""The vision-language paths on one device, in process (no Ray, no vLLM): the FSDP2 engine against transformers
on image prompts, and the visual quickstart task's SFT.

    python bench/gpu_vision.py [--device cuda] [--sft-steps 300] [--json out.json]

Written for the lent GPU machine, which has torch and transformers but neither Ray nor vLLM (DESIGN.md), so
the GRPO half of `tandem quickstart --task vision` (vLLM rolls out image prompts) cannot run there. Two
sections, each for float32 and bfloat16 parameters:

- **parity**: the tiny Qwen2-VL of models/tiny_vlm.py in the FSDP2 engine (a one-rank process group: NCCL on
  CUDA, gloo on CPU), padded and packed, against the transformers model in float32 on the same device, on
  16 count_squares prompts with their answers: the largest |log-prob difference| over the real tokens;
  then one optimizer step and its grad norm.
- **sft**: the SFT stage of `tandem quickstart --task vision` (trainer.backend=inprocess, one rank), a fixed
  number of steps with a validation every 50: its validation losses, the median step time, peak memory,
  and the exported model's greedy first-token accuracy on the 256 held-out images (an answer is one digit).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

DTYPES = ("float32", "bfloat16")


def say(line: str) -> None:
    print(f"[gpu_vision] {line}", flush=True)


def processor_of(folder: Path) -> Any:
    from transformers import AutoProcessor

    from tandem.models.without_torchvision import adapt_transformers

    adapt_transformers()
    return AutoProcessor.from_pretrained(folder)


def answered_rows(folder: Path, rows_file: Path, count: int) -> Any:
    """The first `count` rows of a count_squares file as prompt + answer + EOS, right-padded, with their images'
    inputs (the SFT dataset's collation)."""
    from tandem.data import SFTDataset, collate_sft

    processor = processor_of(folder)
    data = SFTDataset([str(rows_file)], processor.tokenizer, max_length=64, processor=processor)
    return collate_sft([data[i] for i in range(count)], processor.tokenizer.pad_token_id)


def padded(output: Any) -> torch.Tensor:
    """An engine forward's logits in the padded layout [B, T, V], packed or not."""
    return output.logits if output.packing is None else output.packing.unpack(output.logits)


@torch.no_grad()
def transformers_logits(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, images: list[dict]
) -> torch.Tensor:
    """transformers' own forward of a padded batch whose every row holds images (`multi_modal_inputs`)."""
    return model(
        input_ids=ids,
        attention_mask=mask,
        mm_token_type_ids=(ids == model.config.image_token_id).long(),
        pixel_values=torch.cat([i["pixel_values"] for i in images]).to(ids.device),
        image_grid_thw=torch.cat([i["image_grid_thw"] for i in images]).to(ids.device),
    ).logits


def one_rank_group(device: torch.device) -> None:
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def parity(folder: Path, rows_file: Path, device: torch.device) -> dict[str, dict[str, float]]:
    from transformers import Qwen2VLForConditionalGeneration

    from tandem.algos import log_probs_from_logits
    from tandem.config.schema import FSDPConfig, OptimConfig
    from tandem.engine import EngineSpec, FSDPEngine

    batch = answered_rows(folder, rows_file, 16)
    reference = Qwen2VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    images = batch["multi_modal_inputs"]
    logits = transformers_logits(reference, ids, mask, images)
    expected = log_probs_from_logits(logits[:, :-1].float(), ids[:, 1:]).cpu()
    real = batch["attention_mask"][:, 1:].bool()
    out = {}
    for dtype, packing in ((dtype, packing) for dtype in DTYPES for packing in (False, True)):
        engine = FSDPEngine(
            EngineSpec(
                model_path=folder,
                head="lm",
                device=device,
                optim=OptimConfig(lr=1e-4),
                fsdp=FSDPConfig(param_dtype=dtype),
                grad_clip=1.0,
                total_training_steps=10,
                packing=packing,
            )
        )

        def token_log_probs(output: Any, micro: Any) -> dict[str, torch.Tensor]:
            return {
                "log_probs": log_probs_from_logits(padded(output)[:, :-1].float(), micro["input_ids"][:, 1:])
            }

        def nll(output: Any, micro: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            log_probs = log_probs_from_logits(padded(output)[:, :-1].float(), micro["input_ids"][:, 1:])
            loss = -(log_probs * micro["attention_mask"][:, 1:]).sum() / real.sum()
            return loss, {"loss": loss.detach()}

        inputs = batch.select("input_ids", "attention_mask", "multi_modal_inputs")
        got = engine.forward(inputs, token_log_probs, 8)["log_probs"]
        step = engine.train_step(inputs, nll, 8)
        label = f"{dtype}, {'packed' if engine.packing else 'padded'}"
        out[label] = {
            "max_abs_log_prob_diff": float((got - expected)[real].abs().max()),
            "grad_norm": float(step.grad_norm),
        }
        say(f"parity {label}: {out[label]}")
        del engine
    return out


def first_token_accuracy(folder: Path, rows_file: Path, device: torch.device) -> float:
    """Greedy first-token accuracy of a model folder on a count_squares file (each answer is one digit)."""
    import pyarrow.parquet as pq
    from transformers import Qwen2VLForConditionalGeneration

    from tandem.data import PromptDataset, collate_prompts

    processor = processor_of(folder)
    data = PromptDataset([str(rows_file)], processor.tokenizer, processor=processor, max_prompt_length=64)
    truths = [row["reward_model"]["ground_truth"] for row in pq.read_table(rows_file).to_pylist()]
    model = Qwen2VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    right = 0
    for start in range(0, len(data), 64):
        items = [data[i] for i in range(start, min(start + 64, len(data)))]
        batch = collate_prompts(items, processor.tokenizer.pad_token_id)
        ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        images = [item["multi_modal_inputs"] for item in items]
        logits = transformers_logits(model, ids, mask, images)[:, -1]
        answers = processor.tokenizer.batch_decode(logits.argmax(-1)[:, None])
        right += sum(a == truths[start + k] for k, a in enumerate(answers))
    return right / len(data)


def sft(workdir: Path, device: torch.device, steps: int) -> dict[str, dict[str, Any]]:
    from tandem.commands.quickstart import RECIPES, prepare
    from tandem.config import load_config
    from tandem.trainer.sft import SFTTrainer

    recipe = RECIPES["vision"]
    out = {}
    for dtype in DTYPES:
        root = workdir / f"sft-{dtype}"
        model_dir, shared = prepare(root, 0, recipe)
        cfg = load_config(
            "sft",
            [
                *recipe.common,
                *recipe.sft,
                *shared,
                f"actor.model_path={model_dir}",
                "trainer.backend=inprocess",
                f"trainer.device={device.type}",
                "trainer.workers_per_node=1",
                f"trainer.total_training_steps={steps}",
                "trainer.test_freq=50",
                f"actor.fsdp.param_dtype={dtype}",
            ],
            require_data=True,
        )
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        trainer = SFTTrainer(cfg)
        history = trainer.fit()
        seconds = time.perf_counter() - start
        val = [(m["step"], round(m["val/loss"], 4)) for m in history if "val/loss" in m]
        step_s = [m["timing_s/step"] for m in history if "timing_s/step" in m]
        out[dtype] = {
            "val_loss": val,
            "median_step_s": statistics.median(step_s[1:]),
            "seconds": round(seconds, 1),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan"),
            "first_token_accuracy": first_token_accuracy(
                trainer.hf_dir, root / "data" / "val.parquet", device
            ),
        }
        say(f"sft {dtype}: {out[dtype]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--sections", default="parity,sft")
    parser.add_argument("--json", help="also write every number to this file")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device; pass --device cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    say(f"{name}, torch {torch.__version__}")
    from tandem.data import write_splits
    from tandem.models.tiny_vlm import save_tiny_vlm

    workdir = Path(tempfile.mkdtemp(prefix="tandem-gpu-vision-"))
    results: dict[str, Any] = {"device": name}
    if "parity" in args.sections:
        folder = save_tiny_vlm(workdir / "model")
        files = write_splits("count_squares", workdir / "data", n_train=16, n_val=16)
        one_rank_group(device)
        results["parity"] = parity(folder, files["val"], device)
    if "sft" in args.sections:
        results["sft"] = sft(workdir, device, args.sft_steps)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
