"""Mixture-of-experts models on the megatron engine: Tandem's load-balancing term in megatron's routers,
and the experts' weights gathered over the expert-parallel ranks.

Balance term. The same term as on FSDP2 (engine/moe.py: the mean over MoE layers of E / k sum_e P_e f_e
on a micro-batch's real tokens, times its share of the step's tokens and the coefficient), computed here
from each router's input, in the layer that holds it: under pipeline parallel a stage's layers are not on
the stage that computes the loss. A forward hook on every `TopKRouter` computes the layer's term and ties
it to the router's output with `_AttachLoss`: the output passes unchanged, and in backward the term
receives its weight as its gradient (what megatron's `MoEAuxLossAutoScaler` does for megatron's own
auxiliary losses, with a weight fixed at forward time, so pipelined schedules that interleave forward and
backward passes keep each micro-batch's). With activation checkpointing a router runs twice, without
autograd and again in backward; the recomputation takes the micro-batch of the first pass it repeats (a
stage's backward passes follow its forwards in order). Under sequence parallel a router sees its TP rank's share of
the tokens: the per-expert sums are summed over the TP group (forward all-reduce, identity backward; the
router weight's partial gradients are then summed by megatron, the weight being marked sequence parallel).
Under context parallel a router sees its CP rank's columns of every row (context_parallel.py): the sums are
also summed over the CP group, so each layer's term is the whole rows' (as on one rank, not a mean of the
ranks' terms, which differ: f and P are not linear in the tokens), and megatron's DDP sums the router
weight's partial gradients over the CP ranks. Its average over data x context ranks is undone as for the
language-model loss (megatron's schedule scales that by the CP size): the term's weight is multiplied by
data parallel x CP size.
"""

from __future__ import annotations

from collections import defaultdict, deque
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
        groups: tuple[Any, ...],
    ) -> None:
        self.routing = routing
        self.num_layers = num_layers
        self.groups = groups  # the process groups a router's rows are split over (`row_groups`)
        self._tokens: Tensor | None = None  # the current micro-batch's real tokens, in the router's row order
        self._weight = 0.0
        self._share = 0.0
        self.total = 0.0  # sum over this rank's layers and micro-batches of share x term / num_layers
        # recomputed routers (activation checkpointing): what each first pass saw, oldest first
        self._pending: dict[int, deque[tuple[Tensor, float, float]]] = defaultdict(deque)
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
        if not torch.is_grad_enabled():
            # A training forward without autograd is activation checkpointing's first pass: megatron runs the
            # layer again in backward, under pipeline parallel after later micro-batches' forwards. A stage runs
            # its backward passes in the order of its forwards, so the recomputation takes the oldest.
            if self._tokens is not None:
                self._pending[id(module)].append((self._tokens, self._share, self._weight))
            return None
        pending = self._pending.get(id(module))
        if pending:
            tokens, share, weight = pending.popleft()
        elif self._tokens is not None:
            tokens, share, weight = self._tokens, self._share, self._weight
        else:
            return None
        hidden = args[0]
        logits = F.linear(hidden.reshape(-1, hidden.shape[-1]), module.weight).float()
        term = moe.balance_term(logits, tokens.to(logits.device), self.routing, self.groups)
        self.total += float(term.detach()) * share / self.num_layers
        probs, routing_map = output
        return _AttachLoss.apply(probs, term, weight), routing_map

    def take_total(self) -> float:
        self._pending.clear()
        total, self.total = self.total, 0.0
        return total


def row_groups(tp_group: Any, sequence_parallel: bool, cp_group: Any) -> tuple[Any, ...]:
    """The process groups a router's rows are split over: the TP group under sequence parallel, the CP group
    under context parallel (None: no context parallel)."""
    return (*((tp_group,) if sequence_parallel else ()), *((cp_group,) if cp_group is not None else ()))


def router_rows(
    real: Tensor, tp_rank: int, tp_size: int, sequence_parallel: bool, columns: Tensor | None = None
) -> Tensor:
    """[rows, width] real-token mask of a micro-batch's model inputs -> the routers' row order: megatron's
    hidden states are [width, rows, H] (this TP rank's width slice under sequence parallel), flattened; under
    context parallel the width is this CP rank's `columns` [rows, width / CP] of each row (context_parallel.py)."""
    if columns is not None:
        real = real.gather(1, columns)
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
    under sequence parallel, this CP rank's columns under context parallel: the schedule cuts the target and
    gathers the record over both). A token without a valid record takes experts 0..k-1 (megatron replaces the whole
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
