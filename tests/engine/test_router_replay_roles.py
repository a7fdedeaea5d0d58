"""Router replay R2 through the actor (roles/actor.py) on FSDP2 (1 rank) and megatron (2 ranks, TP 2 with
sequence parallel + expert parallel 2: the routers' rows split over the TP ranks and gathered back; and context
parallel 2 + expert parallel 2: each rank routes its two chunks of every row, the record gathered back in column
order and the target cut the same way), a tiny Mixtral (router_replay_scenarios.py).

Both engines record the same routing in the old-log-prob pass (same weights: the same experts per token) and the
same log-probs; a forward that replays it changes no number; two steps of the actor's update replaying it give
the same losses and gradient norms on both engines; after the routers' weights move, the replayed forward equals
on both engines (FSDP2's replay is checked against transformers in test_router_replay.py) and differs from a
fresh one, which routes elsewhere.
"""

from __future__ import annotations

import uuid

import pytest
import torch

from tandem.models.tiny import save_tiny

from . import router_replay_scenarios as rs
from .ranks import start_ranks

pytest.importorskip("megatron.core")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOL = 1e-4


def run(strategy, layout, world, path, out):
    out.mkdir(parents=True, exist_ok=True)
    init = f"file://{out / f'store-{uuid.uuid4().hex}'}"
    start_ranks(rs.worker, (world, init, strategy, layout, str(path), str(out)), world)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay_roles")
    path = save_tiny(root / "mixtral", num_experts=4, experts_per_token=2)
    fsdp = run("fsdp", (1, False, 1), 1, path, root / "fsdp")[0]
    megatron = run("megatron", (2, True, 2), 2, path, root / "megatron")
    megatron += run("megatron", (1, False, 2, 2), 2, path, root / "megatron_cp")
    return fsdp, megatron


def real_sets(routed, mask):
    return routed[mask.bool()].sort(-1).values


def test_both_engines_record_and_replay_alike(results):
    fsdp, ranks = results
    mask = rs.sc.rollout_batch(seed=3)["attention_mask"]
    response = rs.sc.rollout_batch(seed=3)["response_mask"].bool()
    for meg in ranks:  # every rank of both layouts returns the same
        assert torch.equal(real_sets(meg["routed"], mask), real_sets(fsdp["routed"], mask))
        assert (meg["routed"][~mask.bool()] == -1).all()
        assert torch.allclose(meg["old_log_probs"], fsdp["old_log_probs"], atol=TOL)
        for result in (meg, fsdp):
            assert torch.allclose(
                result["replayed_same"][response], result["old_log_probs"][response], atol=1e-6
            )
        for step_m, step_f in zip(meg["steps"], fsdp["steps"], strict=True):
            for key in ("actor/pg_loss", "actor/grad_norm", "actor/router_aux_loss"):
                assert step_m[key] == pytest.approx(step_f[key], abs=TOL), key
        moved = (real_sets(meg["fresh_routed"], mask) != real_sets(meg["routed"], mask)).any(-1)
        assert moved.float().mean() > 0.2
        assert torch.allclose(meg["replayed_moved"][response], fsdp["replayed_moved"][response], atol=TOL)
        gap = (meg["replayed_moved"][response] - meg["fresh_moved"][response]).abs().max()
        assert gap > 1e-3
    assert fsdp["steps"][1]["actor/grad_norm"] > 0
