"""Mixture-of-experts models on the megatron engine: Tandem's load-balancing term in megatron's routers,
and the experts' weights gathered over the expert-parallel ranks.

Balance term. The same term as on FSDP2 (engine/moe.py: the mean over MoE layers of E / k sum_e P_e f_e
on a micro-batch's real tokens, times its share of the step's tokens and the coefficient), computed here
from each router's input, in the layer that holds it: under pipeline parallel a stage's layers are not on
the stage that computes the loss. A forward hook on every `TopKRouter` computes the layer's term and ties
it to the router's output with `_AttachLoss`: the output passes unchanged, and in backward the term
receives its weight as its gradient (what megatron's `MoEAuxLossAutoScaler` does for megatron's own
auxiliary losses, with a weight fixed at forward time, so pipelined schedules that interleave forward and
backward passes keep each micro-batch's). Under sequence parallel a router sees its TP rank's share of
the tokens: the per-expert sums are summed over the TP group (forward all-reduce, identity backward; the
router weight's partial gradients are then summed by megatron, the weight being marked sequence parallel).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from tandem.engine import moe, router_replay


class _AttachLoss(torch.autograd.Function):
    """Identity on `output`; in backward, `loss` gets `weight` as its gradient (it joins the objective)."""

    @staticmethod
    def forward(ctx: Any, output: Tensor, loss: Tensor, weight: float) -> Tensor:
        ctx.weight = weight
        ctx.loss_shape = loss.shape
        return output

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        return grad, torch.full(ctx.loss_shape, ctx.weight, dtype=torch.float32, device=grad.device), None


class RouterBalance:
    """Hooks on the routers of `chunks` adding the balance term while `begin` has set a micro-batch."""

    def __init__(
        self,
        chunks: list[nn.Module],
        routing: moe.Routing,
        num_layers: int,
        tp_group: Any,
        sequence_parallel: bool,
    ) -> None:
        self.routing = routing
        self.num_layers = num_layers
        self.group = tp_group if sequence_parallel else None
        self._tokens: Tensor | None = None  # the current micro-batch's real tokens, in the router's row order
        self._weight = 0.0
        self._share = 0.0
        self.total = 0.0  # sum over this rank's layers and micro-batches of share x term / num_layers
        self._handles = [
            module.register_forward_hook(self._hook)
            for chunk in chunks
            for name, module in chunk.named_modules()
            if name.endswith("mlp.router")
        ]

    def begin(self, tokens: Tensor | None, share: float, loss_scale: float) -> None:
        """The next forward's real tokens ([rows] bool as the routers see them; None: add nothing), its share
        of the step's tokens, and the factor the engine scales its loss by."""
        self._tokens = tokens
        self._share = share
        self._weight = self.routing.coef * share * loss_scale / self.num_layers

    def _hook(self, module: nn.Module, args: tuple, output: Any) -> Any:
        if self._tokens is None or not torch.is_grad_enabled():
            return None
        hidden = args[0]
        logits = F.linear(hidden.reshape(-1, hidden.shape[-1]), module.weight).float()
        term = moe.balance_term(logits, self._tokens.to(logits.device), self.routing, self.group)
        self.total += float(term.detach()) * self._share / self.num_layers
        probs, routing_map = output
        return _AttachLoss.apply(probs, term, self._weight), routing_map

    def take_total(self) -> float:
        total, self.total = self.total, 0.0
        return total


def router_rows(real: Tensor, tp_rank: int, tp_size: int, sequence_parallel: bool) -> Tensor:
    """[rows, width] real-token mask of a micro-batch's model inputs -> the routers' row order: megatron's
    hidden states are [width, rows, H] (this TP rank's width slice under sequence parallel), flattened."""
    by_column = real.t()
    if sequence_parallel:
        by_column = by_column.chunk(tp_size, dim=0)[tp_rank]
    return by_column.reshape(-1)


def stack_experts(pieces: list[Tensor], group: Any, size: int) -> Tensor:
    """This rank's experts' rows of one fused tensor (in local order) -> all experts' [E, ...] (expert-parallel
    ranks hold consecutive experts)."""
    local = torch.stack(pieces)
    if size == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local.contiguous(), group=group)
    return torch.cat(parts)


class RouterTape:
    """Router replay on megatron (engine/router_replay.py): drives megatron-core's own per-router replay
    (`TopKRouter.router_replay`, built with `moe_enable_routing_replay`) for each micro-batch, and gathers what it
    recorded. Each router's layer is its global `layer_number` (1-based), so pipeline stages and virtual chunks
    index the same [.., L, k] column.

    Rows are the routers' order: megatron's hidden states [width, rows, H] flattened (this TP rank's width slice
    under sequence parallel). A token without a valid record takes experts 0..k-1 (megatron replaces the whole
    top-k; such tokens are padding nothing attends to)."""

    def __init__(self, chunks: list[nn.Module], routing: moe.Routing, num_layers: int) -> None:
        self.routing, self.num_layers = routing, num_layers
        self._routers = [
            (module.layer_number - 1, module.router_replay)
            for chunk in chunks
            for name, module in chunk.named_modules()
            if name.endswith("mlp.router")
        ]
        if any(replay is None for _, replay in self._routers):
            raise RuntimeError("router replay: megatron built the routers without moe_enable_routing_replay")
        self._recorded: dict[int, dict[int, Tensor]] = {}
        self._key, self._recording = 0, False  # the micro-batch `begin` set, and whether it records

    def begin(self, key: int, target: Tensor | None, record: bool) -> None:
        """Before micro-batch `key`'s forward on this stage: replay `target` [rows, L, k] (None: the routers
        choose), `record` what they use."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        self._key = key
        if target is not None:
            fallback = torch.arange(self.routing.top_k, device=target.device).expand(target.shape[0], -1)
        for layer, replay in self._routers:
            replay.clear_indices()
            if target is not None:
                given = target[:, layer]
                given = torch.where(
                    router_replay.valid_rows(given, self.routing.num_experts)[:, None], given, fallback
                )
                replay.set_target_indices(given)
                replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
            elif record:
                replay.set_router_replay_action(RouterReplayAction.RECORD)
            else:
                replay.clear_router_replay_action()
        self._recording = record

    def collect(self) -> None:
        """After the forward: what this stage's routers used for the current micro-batch."""
        if not self._recording:
            return
        kept = self._recorded.setdefault(self._key, {})
        for layer, replay in self._routers:
            used = replay.get_recorded_indices() if replay.target_topk_idx is None else replay.target_topk_idx
            if used is not None:
                kept[layer] = used.detach().long()
                replay.clear_indices()

    def take(self, key: int, rows: int, device: torch.device) -> Tensor:
        """Micro-batch `key`'s [rows, L, k] (-1 on the layers of other stages), forgotten here."""
        out = torch.full((rows, self.num_layers, self.routing.top_k), -1, dtype=torch.long, device=device)
        for layer, indices in self._recorded.pop(key, {}).items():
            out[:, layer] = indices
        return out

    def end(self) -> None:
        for _, replay in self._routers:
            replay.clear_indices()
            replay.clear_router_replay_action()
        self._recorded = {}
