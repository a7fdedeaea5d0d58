"""The FSDP2 engine (`fully_shard`) and what it alone uses: Ulysses sequence parallel, vision-language
inputs, the reshard of row shards into a tensor-parallel rollout's cuts, LoRA adapters."""

from tandem.engine.fsdp.engine import FSDPEngine

__all__ = ["FSDPEngine"]
