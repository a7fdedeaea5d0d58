"""Router replay for mixture-of-experts models: the experts each token was routed to, recorded in one pass and
imposed on a later one (verl's actor.router_replay; the roles choose when, roles/actor.py).

The routing travels with the rows as one batch column, `routed_experts` [B, T, L, k] (int64): for every token
position of the padded batch and every decoder layer, the k experts its router chose; -1 where there is no token
(padding) and on the layers of a dense MLP. The engines own the two directions:

- record: `TrainEngine.forward(..., record_routing=True)` adds the column to the outputs, each router's choice
  of the forward pass (the routers run as always).
- replay: a micro-batch that carries the column (in `forward` or `train_step`) is routed to those experts: each
  router's top-k choice is replaced by the recorded one, and the gate weights of the chosen experts are computed
  from the router's current logits as the model computes them for its own choice (so the router keeps its
  gradient). A token without a valid record (-1, or an expert named twice, as in a dummy row of zeros) keeps its
  own choice on FSDP2 and takes experts 0..k-1 on megatron (such tokens are padding nothing attends to).

Unlike verl, whose megatron actor keeps the indices in per-layer objects of a process-wide list between calls,
the record here is a column of the step's batch: it is cut into micro-batches, split over ranks and packed with
the rows it belongs to, so the old-log-prob pass and the update may cut the batch differently.

This module: the column's name, the mapping between the padded [B, T] layout and the model's input grid
(packed rows or padded ones), and the hooks on Hugging Face routers (the FSDP2 engine's models). megatron-core's
routers carry their own replay (TopKRouter.router_replay, TransformerConfig.moe_enable_routing_replay), which the
megatron engine drives (engine/megatron/experts.py).
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tandem.data.packing import Packing

ROUTED_EXPERTS = "routed_experts"

# Hugging Face routers whose forward is `logits -> softmax -> top-k (-> renormalised over the k)`, returning
# (logits, scores, indices): their scores for given indices are recomputed by `_scores_for`.
HF_ROUTERS = ("MixtralTopKRouter", "Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def to_grid(routed: Tensor, packing: Packing | None, grid: tuple[int, int]) -> Tensor:
    """[b, T, L, k] per padded position -> [rows, width, L, k] at the model's input positions (packed rows
    when `packing`, else the padded batch itself), padded with -1 to `grid` (rows, width)."""
    placed = packing.pack(routed, fill=-1) if packing is not None else routed
    rows, width = placed.shape[:2]
    extra_rows, extra_width = grid[0] - rows, grid[1] - width
    if extra_rows or extra_width:
        placed = F.pad(placed, (0, 0, 0, 0, 0, extra_width, 0, extra_rows), value=-1)
    return placed


def from_grid(placed: Tensor, packing: Packing | None, shape: tuple[int, int], real: Tensor | None) -> Tensor:
    """The inverse of `to_grid`: [rows, width, L, k] (the grid may be larger) -> [b, T, L, k], -1 where `real`
    ([b, T] bool, padded layout) is False or packing put no token."""
    if packing is not None:
        rows, width = packing.packed_shape
        return packing.unpack(placed[:rows, :width].contiguous(), fill=-1)
    out = placed[: shape[0], : shape[1]].clone()
    if real is not None:
        out[~real.bool()] = -1
    return out


def valid_rows(indices: Tensor, num_experts: int) -> Tensor:
    """[n] bool: rows of `indices` [n, k] that name k different experts in [0, num_experts)."""
    in_range = ((indices >= 0) & (indices < num_experts)).all(-1)
    ordered = indices.sort(-1).values
    distinct = (ordered[:, 1:] != ordered[:, :-1]).all(-1)
    return in_range & distinct


class HFRouterReplay:
    """Forward hooks on the routers of a Hugging Face MoE model (HF_ROUTERS) that record or replay its choices.

    `begin(target, record)` before every model call: `target` [tokens, L, k] in the routers' row order (the
    flattened input grid) is replayed (None: the routers choose); `record`: each layer's choice is kept, and
    `take()` after the call returns it as [tokens, L, k] (-1 on layers without a router). What `begin` set holds
    until the next `begin` or `end`, so a backward that recomputes the layers (activation checkpointing) routes
    as its forward did."""

    def __init__(self, model: nn.Module, num_layers: int, top_k: int, num_experts: int, where: str) -> None:
        self.num_layers, self.top_k, self.num_experts = num_layers, top_k, num_experts
        self.recording = False
        self._target: Tensor | None = None
        self._recorded: dict[int, Tensor] = {}
        routers = [
            (name, module)
            for name, module in model.named_modules()
            if type(module).__name__.endswith("TopKRouter")
        ]
        unknown = sorted({type(m).__name__ for _, m in routers} - set(HF_ROUTERS))
        if unknown or not routers:
            raise ValueError(
                f"actor.router_replay: {where}'s routers ({', '.join(unknown) or 'none found'}) are not ones "
                f"Tandem replays (softmax top-k routers: {', '.join(HF_ROUTERS)}); set actor.router_replay=off"
            )
        self._handles = []
        for name, module in routers:
            layer = int(_LAYER.search(name).group(1))
            self._handles.append(module.register_forward_hook(self._hook(layer)))

    def begin(self, target: Tensor | None, record: bool) -> None:
        self._target, self.recording, self._recorded = target, record, {}

    def end(self) -> None:
        self._target, self.recording = None, False

    def take(self, tokens: int, device: torch.device) -> Tensor:
        out = torch.full((tokens, self.num_layers, self.top_k), -1, dtype=torch.long, device=device)
        for layer, indices in self._recorded.items():
            out[:, layer] = indices
        self._recorded = {}
        return out

    def _hook(self, layer: int) -> Any:
        def hook(module: nn.Module, args: tuple, output: tuple[Tensor, Tensor, Tensor]) -> Any:
            logits, scores, indices = output
            replaced = None
            if self._target is not None:
                target = self._target[:, layer].to(indices.device)
                keep = valid_rows(target, self.num_experts)
                chosen = torch.where(keep[:, None], target, indices.long())
                replaced = (
                    logits,
                    _scores_for(module, logits, chosen).to(scores.dtype),
                    chosen.to(indices.dtype),
                )
            if self.recording:  # what the layer used: its own choice, or the replayed one
                self._recorded[layer] = (indices if replaced is None else replaced[2]).detach().long()
            return replaced

        return hook


def _scores_for(module: nn.Module, logits: Tensor, indices: Tensor) -> Tensor:
    """The gate weights an HF_ROUTERS router gives `indices`: softmax over all experts in float32, gathered,
    renormalised over the k when the router does (Mixtral always; Qwen's with norm_topk_prob)."""
    probs = torch.softmax(logits.float(), dim=-1).gather(1, indices)
    if getattr(module, "norm_topk_prob", True):
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs
