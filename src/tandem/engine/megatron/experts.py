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

from tandem.engine import moe


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
