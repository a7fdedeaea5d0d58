"""Memory of a LoRA actor and its reference policy (issue 19): what `actor.lora` saves, measured.

    .venv/bin/python bench/lora_memory.py [--size 100M] [--rank 8]

One process per configuration (a fresh peak), one gloo rank, the FSDP2 engine on a Qwen2 shape of
`tandem.models.tiny.build_model` (the sizes of bench/adamw.py). Each builds the actor (AdamW) and a reference
policy, runs one training step (8 rows of 128 tokens, the actor's optimizer state then exists) and one
reference forward, and reports the process's peak resident memory (ru_maxrss) and its memory after
building the engines:

  full                      every weight trains; the reference is a second, frozen engine on the folder
  lora, reference engine    adapters train; the reference still a second engine (what LoRA alone saves)
  lora, adapters off        adapters train; the reference is the actor with its adapters off (Tandem's)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

SHAPES = {"W1": (256, 4, 4, 2, 768), "8x": (512, 8, 8, 4, 1536), "100M": (1024, 8, 16, 8, 3072)}
CONFIGS = ("full", "lora, reference engine", "lora, adapters off")


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(config: str, folder: str, rank: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    from tandem.algos import agg_loss
    from tandem.batch import Batch
    from tandem.config.schema import FSDPConfig, LoraConfig, OptimConfig
    from tandem.engine import EngineSpec, FSDPEngine
    from tandem.engine.fsdp.lora import WithoutAdapter

    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    start = rss_mib()
    lora = LoraConfig(rank=rank, alpha=2.0 * rank) if config.startswith("lora") else None

    def engine(optim, adapters):
        return FSDPEngine(
            EngineSpec(
                model_path=folder,
                head="lm",
                device="cpu",
                optim=optim,
                fsdp=FSDPConfig(param_dtype="float32"),
                grad_clip=1.0,
                total_training_steps=10,
                lora=adapters,
            )
        )

    actor = engine(OptimConfig(lr=1e-5), lora)
    reference = WithoutAdapter(actor) if config == "lora, adapters off" else engine(None, None)
    built = rss_mib()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 300, (8, 128), generator=gen)
    mask = torch.ones_like(ids)
    batch = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1})

    def loss_fn(output, micro):
        logits = output.logits[:, :-1].float()
        log_probs = logits.log_softmax(-1).gather(-1, micro["input_ids"][:, 1:, None]).squeeze(-1)
        return agg_loss(-log_probs, micro["attention_mask"][:, 1:], global_num_tokens=mask[:, 1:].sum()), {}

    actor.train_step(batch, loss_fn, 4)
    reference.forward(batch, lambda output, micro: {"x": output.logits[:, :1, 0]}, 4)
    trainable = sum(p.numel() for p in actor.model.parameters() if p.requires_grad)
    dist.destroy_process_group()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"start_mib": start, "built_mib": built, "peak_mib": peak, "trainable": trainable}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="100M", choices=list(SHAPES))
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--child", nargs=3, metavar=("CONFIG", "FOLDER", "RANK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], int(args.child[2]))))
        return

    from tandem.models.tiny import save_tiny

    hidden, layers, heads, kv_heads, intermediate = SHAPES[args.size]
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_tiny(
            Path(tmp) / "model",
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            intermediate_size=intermediate,
        )
        rows = {}
        for config in CONFIGS:
            out = subprocess.run(
                [sys.executable, __file__, "--child", config, str(folder), str(args.rank)],
                check=True,
                capture_output=True,
                text=True,
            )
            rows[config] = json.loads(out.stdout.strip().splitlines()[-1])
        params = rows["full"]["trainable"]
    print(
        f"model {args.size}: {params / 1e6:.1f} M parameters ({params * 4 / 2**20:.0f} MiB in float32); LoRA rank {args.rank}"
    )
    print(f"{'config':<26}{'trainable':>12}{'built MiB':>12}{'peak MiB':>12}{'peak - full':>14}")
    for config, r in rows.items():
        delta = r["peak_mib"] - rows["full"]["peak_mib"]
        print(f"{config:<26}{r['trainable']:>12,}{r['built_mib']:>12.0f}{r['peak_mib']:>12.0f}{delta:>14.0f}")


if __name__ == "__main__":
    main()
