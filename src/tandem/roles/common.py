"""Pieces every role shares: slicing the response out of a full-sequence output, global counts,
and summing per-micro-batch metric contributions into global values."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from tandem.algos import aggregation
from tandem.algos.core import entropy_from_logits, log_probs_from_logits, sum_pi_squared_from_logits
from tandem.batch import Batch, even_sizes
from tandem.data.packing import equal_count_groups
from tandem.engine.base import LossFn, ModelOutput, StepResult, TrainEngine, scatter_rows
from tandem.engine.lm_head import HeadRows

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids")  # what every engine forward reads
IMAGE_INPUTS = "multi_modal_inputs"  # a vision-language model's rows: their images' processor outputs
# Batch.meta: False splits rows over the ranks in the rollout's order, not by tokens (trainer.balance_batch)
BALANCE_META = "balance_batch"


def input_keys(batch: Batch) -> tuple[str, ...]:
    """The columns an engine forward reads: MODEL_INPUTS, and the image inputs where the rows have them."""
    return (*MODEL_INPUTS, *((IMAGE_INPUTS,) if IMAGE_INPUTS in batch else ()))


def model_inputs(batch: Batch, *extra: str) -> Batch:
    """`batch`'s `input_keys` and `extra` columns."""
    return batch.select(*input_keys(batch), *extra)


def response_slice(per_position: Tensor, response_length: int) -> Tensor:
    """The outputs at the positions that PREDICT the response tokens: [:, P-1 : P+R-1].

    Sequences are prompts ++ responses (rollout/base.py), so the output at position p scores token p+1.
    """
    return per_position[:, -response_length - 1 : -1]


def response_outputs(output: ModelOutput, response_length: int) -> tuple[Tensor, Tensor]:
    """`output.at` the positions that predict the response tokens: (values [M, ...], where [b, R])."""
    b, width = output.shape
    positions = torch.arange(width, device=output.logits.device).expand(b, width)
    return output.at(response_slice(positions, response_length))


def response_logits(
    output: ModelOutput, response_length: int, temperature: float
) -> tuple[Tensor | HeadRows, Tensor]:
    """(logits / T in float32 at the positions that predict the response tokens [M, V], where [b, R]); with
    the engine's chunked LM head, those positions' hidden states, which `token_stats` turns into numbers."""
    # T = 0 (greedy validation) is scored as T = 1, as the rollout engines do.
    scale = temperature if temperature > 0 else 1.0
    rows, where = response_outputs(output, response_length)
    return scaled_logits(output, rows, scale), where


def scaled_logits(output: ModelOutput, rows: Tensor, scale: float) -> Tensor | HeadRows:
    """Outputs read with `output.at` as logits / `scale` in float32, or, with the engine's chunked LM head
    (the rows are hidden states), as the HeadRows that `token_stats` turns into numbers."""
    if output.head is not None:
        return HeadRows(rows, output.head, scale)
    return rows.float() if scale == 1.0 else rows.float() / scale  # x / 1 is x: no [M, V] copy for it


def response_log_probs(
    output: ModelOutput, responses: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """log_softmax(logits / T) of each response token (and the entropy of that distribution), [b, R];
    0 where the model computed nothing (padding of packed sequences)."""
    logits, where = response_logits(output, responses.shape[1], temperature)
    stats = token_stats(output, logits, responses[where], entropy=with_entropy)
    entropy = scatter_rows(stats["entropy"], where) if with_entropy else None
    return scatter_rows(stats["log_probs"], where), entropy


def token_stats(
    output: ModelOutput,
    logits: Tensor | HeadRows,
    labels: Tensor,
    *,
    entropy: bool = False,
    sum_pi_squared: bool = False,
) -> dict[str, Tensor]:
    """log_softmax(logits)[labels] as "log_probs", and when asked the "entropy" and "sum_pi_squared"
    (sum_v softmax(logits)_v^2) of each row, for logits read from `output`: full rows [M, V], this rank's
    vocabulary slice under tensor parallel, or hidden states for the chunked LM head (one pass for all)."""
    if isinstance(logits, HeadRows):
        return logits.stats(labels, entropy=entropy, sum_pi_squared=sum_pi_squared)
    vp = output.vocab_parallel
    out = {"log_probs": vp.log_probs(logits, labels) if vp else log_probs_from_logits(logits, labels)}
    if entropy:
        out["entropy"] = vp.entropy(logits) if vp else entropy_from_logits(logits)
    if sum_pi_squared:
        out["sum_pi_squared"] = vp.sum_pi_squared(logits) if vp else sum_pi_squared_from_logits(logits)
    return out


def global_counts(engine: TrainEngine, mask: Tensor) -> dict[str, float]:
    """aggregation.global_counts of this rank's share of a mini-batch, summed over the data-parallel ranks."""
    local = aggregation.global_counts(mask)
    names = sorted(local)
    total = engine.all_reduce_sum(torch.tensor([local[k] for k in names], dtype=torch.float64))
    return {k: total[i].item() for i, k in enumerate(names)}


def token_share(mask: Tensor, counts: dict[str, Tensor]) -> float:
    """This micro-batch's share of the mini-batch's valid tokens: weights a token mean into a contribution."""
    return float((mask != 0).sum()) / max(float(counts["global_num_tokens"]), 1.0)


def sum_step_metrics(engine: TrainEngine, results: Sequence[StepResult], prefix: str) -> dict[str, float]:
    """Metrics of one update (several optimizer steps).

    loss_fn metrics are CONTRIBUTIONS to their mini-batch's global value: summed over micro-batches
    and ranks they give that mini-batch's value; mini-batches are then averaged. grad_norm and lr are
    averaged over optimizer steps; skipped steps are counted.
    """
    if not results:
        return {}
    names = sorted({name for r in results for name in r.metrics})
    per_step = torch.tensor(
        [[sum(r.metrics.get(name, [])) for name in names] for r in results], dtype=torch.float64
    )
    if names:
        per_step = engine.all_reduce_sum(per_step)
    # A name with its own prefix ("rollout_mismatch/kl") is kept as it is.
    metrics = {
        name if "/" in name else f"{prefix}/{name}": float(per_step[:, i].mean())
        for i, name in enumerate(names)
    }
    finite = [r.grad_norm for r in results if not r.skipped]
    metrics[f"{prefix}/loss"] = sum(r.loss for r in results) / len(results)
    metrics[f"{prefix}/grad_norm"] = sum(finite) / len(finite) if finite else float("nan")
    metrics[f"{prefix}/lr"] = results[-1].lr
    metrics[f"{prefix}/skipped_steps"] = float(sum(r.skipped for r in results))
    metrics[f"{prefix}/optimizer_steps"] = float(len(results))
    return metrics


def run_update(
    engine: TrainEngine,
    batch: Batch,
    *,
    epochs: int,
    mini_batches_per_epoch: int,
    micro_batch_size: int,
    make_loss_fn: Callable[[dict[str, Any], Batch], LossFn],
    prefix: str,
    mask_key: str = "response_mask",
) -> dict[str, float]:
    """`epochs` passes over this rank's share of the batch, one optimizer step per mini-batch, then one
    LR-schedule step; the metrics of `sum_step_metrics`. Each mini-batch's loss is
    `make_loss_fn(counts, mini)`: the global counts of its `mask_key` tokens, and this rank's share of it
    (called on every rank, before the mini-batch's first micro-batch: it may run collectives)."""
    results: list[StepResult] = []
    with engine.on_device(
        train=True
    ):  # an engine that offloads between calls moves its state once per update
        for _ in range(epochs):
            # The same NUMBER of mini-batches on every rank, whatever its share: FSDP steps are collective.
            for mini in batch.chunk(mini_batches_per_epoch):
                counts = global_counts(engine, mini[mask_key])
                results.append(engine.train_step(mini, make_loss_fn(counts, mini), micro_batch_size))
    engine.scheduler_step()
    return sum_step_metrics(engine, results, prefix)


def token_lengths(batch: Batch) -> list[int]:
    """Real tokens per row (prompt + response): what a row costs a packed forward / backward."""
    return batch["attention_mask"].sum(-1).tolist()


def update_order(
    size: int, dp_size: int, num_mini_batches: int, lengths: Sequence[int] | None = None
) -> list[int]:
    """Row order that makes a contiguous data-parallel split hold each GLOBAL mini-batch's parts.

    Mini-batch i is rows [i M, (i+1) M) of the step's batch (uneven sizes allowed); rank r must
    get part r of every mini-batch, in order, so that chunking its shard into `num_mini_batches`
    gives the same mini-batches for any number of ranks (2 ranks == 1 rank, exactly). With the rows'
    token `lengths`, each mini-batch's parts hold as many rows as without and about equal tokens.
    """
    order = []
    minis = torch.arange(size).split(even_sizes(size, num_mini_batches))
    parts = []
    for mini in minis:
        sizes = even_sizes(len(mini), dp_size)
        if lengths is None:
            parts.append([part.tolist() for part in mini.split(sizes)])
        else:
            groups = equal_count_groups([lengths[i] for i in mini], sizes)
            parts.append([[int(mini[i]) for i in group] for group in groups])
    for r in range(dp_size):
        for mini_parts in parts:
            order.extend(mini_parts[r])
    return order


def balanced_parts(batch: Batch, num_parts: int, call: Mapping[str, Any] | None = None) -> list[list[int]]:
    """The rows of each data-parallel part for a forward call (`dispatch(Dispatch.MP, parts=...)`): as
    many rows as an even split, about equal tokens per part (a packed forward costs by tokens); contiguous
    slices when the batch's meta says `balance_batch` False."""
    if num_parts <= 1:
        return [list(range(len(batch)))]
    sizes = even_sizes(len(batch), num_parts)
    if not batch.meta.get(BALANCE_META, True):  # contiguous slices, in the rollout's order
        bounds = [0, *itertools.accumulate(sizes)]
        return [list(range(a, b)) for a, b in itertools.pairwise(bounds)]
    return equal_count_groups(token_lengths(batch), sizes)


def mini_batch_parts(batch: Batch, num_parts: int, call: Mapping[str, Any]) -> list[list[int]]:
    """The rows of each data-parallel part for an update call with `mini_batches=` M: the rows in
    `update_order` (token-balanced), split evenly, so that `run_update`'s `batch.chunk(M)` on each rank
    gives that rank's part of each of the M global mini-batches; with the batch's meta `balance_batch` False each
    part keeps the rollout's order (no token balancing)."""
    if "mini_batches" not in call:
        raise TypeError("an update call must say how many mini-batches the batch makes: mini_batches=<int>")
    lengths = token_lengths(batch) if batch.meta.get(BALANCE_META, True) else None  # None: rollout order
    order = update_order(len(batch), num_parts, call["mini_batches"], lengths)
    bounds = [0, *itertools.accumulate(even_sizes(len(batch), num_parts))]
    return [order[a:b] for a, b in itertools.pairwise(bounds)]
