"""The one start-up line that says where a run computes, on how many ranks and in which dtypes, e.g.
`device: cuda (auto: 8 GPUs in the Ray cluster); actor bf16 compute, fp32 master; rollout vllm bf16; reference
bf16 compute; 8 ranks (1 x 8: auto: 8 GPUs per node on this machine)`.

The dtypes come from the rules the workers apply (engine/base.py `strategy_param_dtype`, roles/rollout.py
`rollout_spec`), resolved here for the chosen device (on a CPU, param_dtype=auto is this process's probe;
the FSDP2 engine's ranks probe their own and take bf16 only if all chose it). Every trained or frozen engine
keeps float32 weights (engine/hf_io.py loads them so) and computes in its compute dtype; a rollout engine
computes in the actor's compute dtype where its facts say so (vLLM), else in float32 (hf).
"""

from __future__ import annotations

import torch

from tandem.config.schema import TandemConfig
from tandem.engine.base import strategy_param_dtype
from tandem.roles.rollout import rollout_spec

SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def device_line(cfg: TandemConfig, device: str, why: str, purpose: str = "rl") -> str:
    """The line for a run of `purpose` (rl, sft, eval: as build_worker_groups) on `device`, chosen because
    `why` (roles/layout.py `device_choice`); only the roles that run appear."""
    where = torch.device(device)
    a, d = cfg.actor, cfg.derived
    compute = SHORT[strategy_param_dtype(a.strategy, a.fsdp, a.megatron, where)]  # every role shares it
    parts = [f"actor {compute} compute, fp32 master"]
    if purpose != "sft":
        spec = rollout_spec(cfg, where)
        parts.append(f"rollout {spec.engine} {SHORT[spec.dtype]}")
    if purpose == "rl":
        if d.reference_needed:
            parts.append(f"reference {compute} compute")
        if d.critic_needed:
            parts.append(f"critic {compute} compute, fp32 master")
        if d.reward_model_needed:
            parts.append(f"reward model {compute} compute")
    return f"device: {device} ({why}); " + "; ".join([*parts, ranks(cfg, purpose)])


def ranks(cfg: TandemConfig, purpose: str = "rl") -> str:
    """`N ranks (nodes x per node, how chosen)`, and the separate rollout pool's when there is one."""
    t, r = cfg.trainer, cfg.rollout
    world = t.nnodes * t.workers_per_node
    text = f"{world} rank{'s' if world > 1 else ''} ({t.nnodes} x {t.workers_per_node}"
    if r.layout == "separate" and purpose != "sft":
        text += f", rollout pool {r.nnodes} x {r.workers_per_node}"
    return f"{text}: {cfg.derived.ranks_why})"
