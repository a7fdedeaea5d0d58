"""AdamW's step time per torch implementation (issue 20): for_loop, foreach, fused (`actor.optim.implementation`).

    .venv/bin/python bench/adamw.py [--steps 5] [--threads 2]

Three Qwen2 shapes of `tandem.models.tiny.build_model` (W1's tokenizer, 320 entries, tied), each sharded with FSDP2
(`fully_shard` per decoder layer and on the root, one gloo rank: the DTensor parameters the engine's
optimizer sees):
  W1     hidden 256,  4 layers,  4 heads / 2 KV, intermediate 768    (3.2 M parameters)
  8x     hidden 512,  8 layers,  8 heads / 4 KV, intermediate 1536   (25 M)
  100M   hidden 1024, 8 layers, 16 heads / 8 KV, intermediate 3072   (101 M)
Per implementation: seeded random gradients, `optimizer.step()` timed --steps times after one warm-up,
the median; then the largest difference of the weights from the for_loop run's after all steps.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import distribute_tensor

from tandem.models.tiny import build_model, build_tokenizer

SHAPES = {"W1": (256, 4, 4, 2, 768), "8x": (512, 8, 8, 4, 1536), "100M": (1024, 8, 16, 8, 3072)}
IMPLEMENTATIONS = {"for_loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def sharded_model(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int) -> torch.nn.Module:
    model = build_model(
        build_tokenizer(),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
    )
    mesh = init_device_mesh("cpu", (1,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def run(shape: tuple[int, ...], kwargs: dict, steps: int) -> tuple[float, torch.Tensor, int]:
    """(median step seconds, the weights after warm-up + steps, parameter count)."""
    model = sharded_model(*shape)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **kwargs)
    gen = torch.Generator().manual_seed(1)
    times = []
    for _ in range(1 + steps):
        for p in params:
            p.grad = distribute_tensor(torch.randn(p.shape, generator=gen), p.device_mesh, p.placements)
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    weights = torch.cat([p.detach().full_tensor().flatten() for p in params])
    return statistics.median(times[1:]), weights, sum(p.numel() for p in params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (the engine sets its rank's share)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    store = Path(tempfile.mkdtemp(prefix="tandem-adamw-")) / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    print(f"AdamW step, FSDP2 parameters on 1 rank, {args.threads} threads; median of {args.steps} steps")
    print(
        f"{'model':<8}{'params':>10}"
        + "".join(f"{name + ' ms':>14}" for name in IMPLEMENTATIONS)
        + f"{'x loop':>10}{'max diff':>12}"
    )
    for name, shape in SHAPES.items():
        results = {impl: run(shape, kwargs, args.steps) for impl, kwargs in IMPLEMENTATIONS.items()}
        loop_s, loop_w, count = results["for_loop"]
        diff = max(float((w - loop_w).abs().max()) for _, w, _ in results.values())
        cells = "".join(f"{1000 * s:>14.1f}" for s, _, _ in results.values())
        print(f"{name:<8}{count / 1e6:>9.1f}M{cells}{loop_s / results['fused'][0]:>10.1f}{diff:>12.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
