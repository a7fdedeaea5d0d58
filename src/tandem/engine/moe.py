"""Mixture-of-experts models on the FSDP2 engine: the router load-balancing loss.

A Hugging Face MoE causal LM (Mixtral, Qwen2-MoE, Qwen3-MoE, ...: a config with `num_local_experts` or
`num_experts`, and `num_experts_per_tok`) trains like a dense one; the engine adds, in every training
pass, the routers' load-balancing loss (Switch Transformer's, as megatron-core computes it per layer):

    balance(layer) = E / k * sum_e P_e * f_e

over the micro-batch's real tokens (padding and the free slots of packed rows do not count), with
E experts, k experts per token, P_e the mean router probability of expert e (softmax over all E
logits) and f_e the fraction of tokens whose top k include e (sum_e f_e = k). It is 1 when the
tokens spread evenly and E / k when every token goes to the same k experts. The loss term is

    router_aux_loss_coef x mean over MoE layers of balance(layer),

each micro-batch weighted by its share of the step's real tokens (the loss contract of engine/base.py,
so how rows are cut into micro-batches and ranks changes only which tokens meet in one balance term),
and `router_aux_loss` (the same mean, unweighted by the coefficient) is reported per update.

`router_aux_loss_coef=None` takes the model's own weight: k x `router_aux_loss_coef` of its config.
transformers' loss for these models (computed when labels are passed) is E x sum_e P_e f_e over all
layers' tokens at once, k times the per-layer term above when every layer routes alike; k x its
coefficient keeps the weight a model was trained with. Why per layer: a layer that balances cannot
hide one that collapses (in transformers' concatenated form, their fractions average first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from tandem.data.packing import Packing


@dataclass(frozen=True)
class Routing:
    """A mixture-of-experts model's router geometry and the weight of its load-balancing loss."""

    num_experts: int
    top_k: int
    coef: float


def routing_of(config: Any, coef: float | None) -> Routing | None:
    """The routing of a Hugging Face config (None for a dense model); `coef` None: the model's own weight."""
    text = getattr(config, "text_config", None) or config
    experts = getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None)
    top_k = getattr(text, "num_experts_per_tok", None)
    if not experts or not top_k:
        return None
    if coef is None:
        coef = top_k * float(getattr(text, "router_aux_loss_coef", 0.0) or 0.0)
    if coef < 0:
        raise ValueError(f"actor.router_aux_loss_coef must be >= 0 (0 turns the loss off), got {coef}")
    return Routing(int(experts), int(top_k), float(coef))


def real_tokens(attention_mask: Tensor | None, shape: tuple[int, ...], packing: Packing | None) -> Tensor:
    """[tokens] bool over the model's flattened input (the router's rows): True at real tokens."""
    if packing is not None:
        mask = torch.zeros(
            packing.packed_shape[0] * packing.packed_shape[1], dtype=torch.bool, device=packing.target.device
        )
        mask[packing.target] = True
        return mask
    if attention_mask is None:
        return torch.ones(shape[0] * shape[1], dtype=torch.bool)
    return attention_mask.reshape(-1) != 0


def balance_loss(router_logits: tuple[Tensor, ...] | list[Tensor], mask: Tensor, routing: Routing) -> Tensor:
    """Mean over layers of E / k * sum_e P_e f_e on the tokens where `mask` is True (module docstring).

    `router_logits`: one [tokens, E] tensor per MoE layer, rows in the order of `mask`. Differentiable in
    the logits through P (f counts, as in the Switch Transformer). A micro-batch with no real token: 0."""
    if not router_logits:
        raise ValueError(
            "balance_loss: the model returned no router logits (is it a mixture-of-experts model?)"
        )
    per_layer = []
    for logits in router_logits:
        if logits.shape[0] != mask.shape[0]:
            raise ValueError(
                f"balance_loss: router logits for {logits.shape[0]} tokens, token mask for {mask.shape[0]}"
            )
        per_layer.append(balance_term(logits.float(), mask.to(logits.device), routing))
    return torch.stack(per_layer).mean()


def balance_term(logits: Tensor, tokens: Tensor, routing: Routing, groups: tuple[Any, ...] = ()) -> Tensor:
    """One layer's E / k sum_e P_e f_e over the rows of `logits` [rows, E] where `tokens` is True. `groups`:
    process groups the rows are split over (megatron's sequence parallel over the TP ranks, context parallel
    over the CP ranks); the per-expert sums and the token count are summed over each in turn (an all-reduce in
    forward, identity in backward: every rank computes the whole rows' term and sends the gradient to its own
    rows)."""
    logits = logits[tokens]
    probs = torch.softmax(logits, dim=-1)
    chosen = torch.topk(probs, routing.top_k, dim=-1).indices.reshape(-1)
    counts = torch.zeros(routing.num_experts, device=logits.device).index_add_(
        0, chosen, torch.ones(chosen.numel(), device=logits.device)
    )
    prob_sums = probs.sum(0)
    num = torch.tensor(float(logits.shape[0]), device=logits.device)
    for group in groups:
        prob_sums = _SumOverGroup.apply(prob_sums, group)
        for value in (counts, num):
            dist.all_reduce(value, group=group)
    if float(num) == 0:
        return prob_sums.sum() * 0.0
    fraction = counts / num  # f_e: sums to k
    return routing.num_experts / routing.top_k * (prob_sums / num * fraction).sum()


class _SumOverGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, value: Tensor, group: Any) -> Tensor:
        value = value.clone()
        dist.all_reduce(value, group=group)
        return value

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None
