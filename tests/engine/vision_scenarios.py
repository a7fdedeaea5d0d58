"""What each spawned rank does in the vision-language FSDP2 tests (test_vision.py): the same image and text-only
prompt rows on 1 rank, or split over 2 ranks so that rank 1 holds text only; log-probs, two optimizer steps and
the weights after them, for the parent to compare."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from data.data_helpers import png  # tests/ is on sys.path (pytest's rootdir)
from tandem.algos import log_probs_from_logits
from tandem.batch import Batch
from tandem.config.schema import FSDPConfig

from .fsdp_scenarios import make_engine

ROWS = (  # (content, image or None): rows 0 and 2 hold an image, rows 1 and 3 text only
    ("<image>Colour?", (56, 56, (200, 30, 60))),
    ("No image, just text.", None),
    ("Wide <image> one?", (84, 56, (10, 200, 60))),
    ("Text again.", None),
)
INPUTS = ("input_ids", "attention_mask", "multi_modal_inputs")


def prompt_batch(model_path: str | Path) -> Batch:
    """ROWS through the model's processor (PromptDataset), collated: 4 left-padded rows."""
    from transformers import AutoProcessor

    from tandem.data import PromptDataset, collate_prompts, write_rows
    from tandem.models.without_torchvision import adapt_transformers

    adapt_transformers()
    processor = AutoProcessor.from_pretrained(model_path)
    rows = [
        {
            "prompt": [{"role": "user", "content": content}],
            "data_source": "shapes",
            "images": None if image is None else [{"bytes": png(*image, diagonal=True)}],
        }
        for content, image in ROWS
    ]
    # a file per process: the ranks of a spawned pair write theirs at once (one shared file was once read
    # half-written: "Parquet magic bytes not found in footer")
    path = write_rows(rows, Path(model_path).parent / f"rows-{os.getpid()}.parquet")
    data = PromptDataset([str(path)], processor.tokenizer, processor=processor, max_prompt_length=64)
    return collate_prompts([data[i] for i in range(len(data))], processor.tokenizer.pad_token_id)


def padded_logits(output) -> torch.Tensor:
    """[B, T, V] logits of a padded or packed forward (0 on padding)."""
    return output.logits if output.packing is None else output.packing.unpack(output.logits)


def token_log_probs(output, micro: Batch) -> dict[str, torch.Tensor]:
    return {"log_probs": log_probs_from_logits(padded_logits(output)[:, :-1], micro["input_ids"][:, 1:])}


def predicted(mask: torch.Tensor) -> torch.Tensor:
    """[B, T-1]: 1 where a real token predicts the next real one (a left-padded row's first real token is
    predicted from padding: a padded forward's output there is the model's, a packed one's is zero)."""
    return mask[:, 1:] * mask[:, :-1]


def nll(output, micro: Batch):
    """Every real next token's negative log-likelihood (after a real token), summed, scaled by a constant (the
    same on any split)."""
    log_probs = log_probs_from_logits(padded_logits(output)[:, :-1], micro["input_ids"][:, 1:])
    loss = -(log_probs * predicted(micro["attention_mask"])).sum() / 100.0
    return loss, {"loss": loss.detach()}


def rank_fn(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    run_rank(rank, world, init_method, model_path, out_dir, packing=False)


def packed_rank_fn(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    run_rank(rank, world, init_method, model_path, out_dir, packing=True)


def run_rank(
    rank: int, world: int, init_method: str, model_path: str, out_dir: str, *, packing: bool
) -> None:
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    try:
        batch = prompt_batch(model_path)
        if world == 2:
            batch = batch.reorder([0, 2] if rank == 0 else [1, 3])  # rank 1: no image at all
        engine = make_engine(model_path, "lm", fsdp=FSDPConfig(param_dtype="float32"), packing=packing)
        result = {
            "packing": engine.packing,
            "log_probs": engine.forward(batch.select(*INPUTS), token_log_probs, 2)["log_probs"],
        }
        result["steps"] = [engine.train_step(batch.select(*INPUTS), nll, micro) for micro in (1, 2)]
        result["state"] = {name: tensor.clone() for name, tensor in engine.state_dict_iter()}
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
