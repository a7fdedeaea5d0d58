"""Each spawned rank of test_megatron_vocab_parallel: log-probs, entropy and sum of squared probabilities of
its vocabulary slice, and the gradients of a loss of the first two with respect to that slice."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tandem.engine.megatron.vocab_parallel import VocabParallel

ROWS, VOCAB = 7, 12


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Full logits (a large spread: the max shift matters), labels in every slice, loss weights."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(ROWS, VOCAB, generator=g, dtype=torch.float64).float() * 8
    labels = torch.tensor([0, 5, 6, 11, 3, 7, 9])
    return logits, labels, torch.randn(ROWS, generator=g), torch.randn(ROWS, generator=g)


def worker(rank: int, world: int, init_method: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        from megatron.core import parallel_state as ps

        from tandem.engine.megatron import cpu_adapter

        cpu_adapter.install()
        ps.initialize_model_parallel(tensor_model_parallel_size=world)
        logits, labels, w_lp, w_ent = inputs()
        local = logits.chunk(world, dim=-1)[rank].clone().requires_grad_(True)
        vp = VocabParallel(ps.get_tensor_model_parallel_group(), rank, world)
        log_probs, entropy = vp.log_probs(local, labels), vp.entropy(local)
        ((log_probs * w_lp).sum() + (entropy * w_ent).sum()).backward()
        result = {"log_probs": log_probs.detach(), "entropy": entropy.detach(), "grad": local.grad}
        with torch.no_grad():
            result["sum_pi_squared"] = vp.sum_pi_squared(local)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
