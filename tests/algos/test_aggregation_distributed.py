"""Data-parallel parity of the loss-aggregation contract, with real processes and torch.distributed.

Two ranks (forked from the session's forkserver, tests/engine/ranks.py; gloo) each take 3 of 6
sequences of uneven lengths (one of them all padding) and split them further into 2 micro-batches,
each cut to its own longest sequence.
Each rank:
  1. computes its local counts with `global_counts` and all_reduces them with SUM: the global
     counts of the whole mini-batch;
  2. calls backward() on every micro-batch's contribution (agg_loss / policy_loss / kl_loss with
     those global counts, norm_length = the mini-batch's full length), with NO division by the
     number of micro-batches;
  3. all_reduces the gradients with SUM.
The result must equal one process computing the full batch in one call (float64, 1e-6).

This is the contract the FSDP2 / Megatron engines must follow. FSDP and DDP AVERAGE gradients
over the data-parallel ranks, so an engine either multiplies each contribution by the DP world
size or reduces with SUM; plain averaging gives 1/world of the right gradient, and per-micro-batch
local normalisation gives a different (wrong) gradient, which the last check here shows.
"""

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from engine.ranks import start_ranks  # tests/ is on sys.path (pytest's rootdir)
from tandem.algos import AGG_MODES, agg_loss, global_counts, kl_loss, log_probs_from_logits, policy_loss

WORLD = 2
LENGTHS = [5, 1, 3, 0, 4, 2]  # row 3 is all padding (e.g. a row added to pad to a divisor of the world)
MAX_LEN, HIDDEN, VOCAB = 5, 3, 6
# rank r holds rows 3r .. 3r+2, split into micro-batches of 2 rows and 1 row
RANK_ROWS = [[slice(0, 2), slice(2, 3)], [slice(3, 5), slice(5, 6)]]
CASES = [f"agg/{mode}" for mode in sorted(AGG_MODES)]
CASES += [f"vanilla/{mode}" for mode in sorted(AGG_MODES)]
CASES += ["kl_loss/low_var_kl"]


def problem() -> dict[str, torch.Tensor]:
    """The fixed data and the linear policy's weight (float64, the same in every process)."""
    gen = torch.Generator().manual_seed(1234)
    weight = torch.randn(HIDDEN, VOCAB, generator=gen, dtype=torch.float64)
    features = torch.randn(len(LENGTHS), MAX_LEN, HIDDEN, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, VOCAB, (len(LENGTHS), MAX_LEN), generator=gen)
    mask = (torch.arange(MAX_LEN)[None, :] < torch.tensor(LENGTHS)[:, None]).double()
    with torch.no_grad():  # old / ref policies: the weight moved far enough that PPO clips some tokens
        old = log_probs_from_logits(
            features @ (weight + 0.5 * torch.randn(weight.shape, generator=gen)), labels
        )
        ref = log_probs_from_logits(
            features @ (weight + 0.3 * torch.randn(weight.shape, generator=gen)), labels
        )
    advantages = torch.randn(len(LENGTHS), MAX_LEN, generator=gen, dtype=torch.float64)
    return {
        "weight": weight,
        "features": features,
        "labels": labels,
        "mask": mask,
        "old": old,
        "ref": ref,
        "advantages": advantages,
    }


def contribution(case: str, weight: torch.Tensor, data: dict, rows: slice, counts: dict) -> torch.Tensor:
    """The loss contribution of `rows`, cut to their own longest sequence (as a dynamic batcher would)."""
    width = max(1, int(data["mask"][rows].sum(-1).max().item()))
    cut = {k: v[rows, :width] for k, v in data.items() if k != "weight"}
    log_probs = log_probs_from_logits(cut["features"] @ weight, cut["labels"])
    agg = {**counts, "norm_length": MAX_LEN}
    kind, name = case.split("/")
    if kind == "agg":
        return agg_loss(-cut["advantages"] * log_probs, cut["mask"], name, **agg)
    if kind == "vanilla":
        loss, _ = policy_loss(
            "vanilla",
            cut["old"],
            log_probs,
            cut["advantages"],
            cut["mask"],
            loss_agg_mode=name,
            agg_kwargs=agg,
        )
        return loss
    return kl_loss(log_probs, cut["ref"], cut["mask"], name, agg_kwargs=agg)


def worker(rank: int, init_method: str, out_path: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )
    try:
        data = problem()
        mine = slice(RANK_ROWS[rank][0].start, RANK_ROWS[rank][-1].stop)
        local = global_counts(data["mask"][mine])
        counts = torch.tensor([local["global_num_tokens"], local["global_num_seqs"]], dtype=torch.int64)
        dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        counts = {"global_num_tokens": int(counts[0]), "global_num_seqs": int(counts[1])}
        results = {"counts": counts}
        for case in CASES:
            weight = data["weight"].clone().requires_grad_(True)
            total = torch.zeros((), dtype=torch.float64)
            for rows in RANK_ROWS[rank]:
                loss = contribution(case, weight, data, rows, counts)
                loss.backward()
                total += loss.detach()
            grad = weight.grad.clone()
            dist.all_reduce(grad, op=dist.ReduceOp.SUM)
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
            results[case] = (total, grad)
        if rank == 0:
            torch.save(results, out_path)
    finally:
        dist.destroy_process_group()


def file_store(directory: str | Path) -> str:
    """A rendezvous file for init_process_group: no TCP port to race for (a free port picked here
    can be taken by another process, e.g. Ray's, before rank 0 binds it)."""
    store = Path(directory) / f"dist-store-{uuid.uuid4().hex}"
    return f"file://{store}"


def single_process(case: str, data: dict, counts: dict | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The full batch in one call (counts None: its own local counts, the same as the global ones)."""
    weight = data["weight"].clone().requires_grad_(True)
    loss = contribution(case, weight, data, slice(0, len(LENGTHS)), counts or {})
    loss.backward()
    return loss.detach(), weight.grad


@pytest.mark.slow
def test_two_ranks_with_micro_batches_equal_one_full_batch(tmp_path):
    out_path = tmp_path / "rank0.pt"
    start_ranks(worker, (file_store(tmp_path), str(out_path)), WORLD)
    results = torch.load(out_path)
    data = problem()
    assert results["counts"] == global_counts(data["mask"]) == {"global_num_tokens": 15, "global_num_seqs": 5}
    for case in CASES:
        full_loss, full_grad = single_process(case, data, None)
        loss, grad = results[case]
        assert full_grad.abs().max() > 1e-3, case  # a real gradient, not two zeros agreeing
        torch.testing.assert_close(loss, full_loss, rtol=1e-6, atol=1e-6, msg=case)
        torch.testing.assert_close(grad, full_grad, rtol=1e-6, atol=1e-6, msg=case)

    # The checks above can fail: normalising each micro-batch by its own counts and averaging over
    # micro-batches and ranks (what a naive engine does) gives another gradient for uneven lengths.
    for case in ("agg/token-mean", "vanilla/seq-mean-token-mean"):
        weight = data["weight"].clone().requires_grad_(True)
        pieces = [rows for rank_rows in RANK_ROWS for rows in rank_rows]
        for rows in pieces:
            local_counts = global_counts(data["mask"][rows])
            (contribution(case, weight, data, rows, local_counts) / len(pieces)).backward()
        _, full_grad = single_process(case, data, None)
        assert not torch.allclose(weight.grad, full_grad, rtol=1e-3, atol=1e-6), case


def test_vanilla_case_clips_some_tokens():
    # the fixture data must exercise PPO's clip, else the vanilla case only re-tests a linear loss
    data = problem()
    log_probs = log_probs_from_logits(data["features"] @ data["weight"], data["labels"])
    _, metrics = policy_loss("vanilla", data["old"], log_probs, data["advantages"], data["mask"])
    assert 0.0 < metrics["pg_clipfrac"].item() < 1.0
