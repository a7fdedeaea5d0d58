"""engine/fsdp/reshard.py over gloo: every rank receives exactly its cut of a tensor from the others' row shards,
and the FSDP2 engine's `state_dict_cuts` gives each rank of a tensor-parallel rollout engine its part of
every weight (4 ranks: two engines of 2 ranks, as DP 2 x rollout TP 2 lays them out)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tandem.engine.fsdp.reshard import chunk_rows, gather_cut
from tandem.models.tiny import save_tiny
from tandem.models.tp_cuts import Cut, TensorParallelCuts

from .fsdp_scenarios import make_engine, spawn

pytestmark = pytest.mark.timeout(300)
SHAPES = [(7, 5), (8, 6), (3,), (2, 4)]  # uneven rows, a 1-D tensor, fewer rows than ranks


def cut_cases(shape: tuple[int, ...], world: int) -> list[list[Cut | None]]:
    """Every rank's cut: all the same rows, different row windows, whole, columns per rank, mixed."""
    rows = shape[0]
    cases = [
        [Cut(0, 1, rows - 1)] * world,
        [Cut(0, min(r, rows - 2), 2) for r in range(world)],
        [None] * world,
        [None if r % 2 else Cut(0, rows // 2, rows - rows // 2) for r in range(world)],
    ]
    if len(shape) == 2:
        cases.append([Cut(1, r % shape[1], 1) for r in range(world)])
    return cases


def rank_fn(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    try:
        generator = torch.Generator().manual_seed(0)
        gathered = []
        for shape in SHAPES:
            full = torch.randn(shape, generator=generator)
            start, end = chunk_rows(shape[0], world)[rank]
            for cuts in cut_cases(shape, world):
                gathered.append((full, cuts[rank], gather_cut(full[start:end], shape, cuts)))
        engine = make_engine(model_path, "lm", optim=None)
        cuts = TensorParallelCuts(engine.config, tensor_parallel=2, world_size=world)
        pieces = {name: (piece.clone(), cut) for name, piece, cut, _ in engine.state_dict_cuts(cuts.cuts)}
        whole = dict(engine.state_dict_iter())
        torch.save({"gathered": gathered, "pieces": pieces, "whole": whole}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    model = save_tiny(tmp_path_factory.mktemp("model") / "tiny", num_layers=1, num_kv_heads=1)
    return spawn(rank_fn, 4, model, tmp_path_factory.mktemp("reshard"))


def test_each_rank_receives_exactly_its_cut_from_the_row_shards(ranks):
    for rank, result in enumerate(ranks):
        for full, cut, got in result["gathered"]:
            want = full if cut is None else full.narrow(cut.dim, cut.start, cut.length)
            assert torch.equal(got, want), (rank, tuple(full.shape), cut)


def test_the_fsdp_engine_gives_each_rollout_rank_its_part_of_every_weight(ranks):
    whole = ranks[0]["whole"]
    for rank, result in enumerate(ranks):
        assert result["pieces"].keys() == whole.keys()
        tp_rank = rank % 2  # ranks 0, 1 and 2, 3 each hold one engine
        for name, (piece, cut) in result["pieces"].items():
            want = whole[name] if cut is None else whole[name].narrow(cut.dim, cut.start, cut.length)
            assert torch.equal(piece, want), (rank, name)
        layer = "model.layers.0."
        q, o = (
            result["pieces"][layer + "self_attn.q_proj.weight"],
            result["pieces"][layer + "self_attn.o_proj.weight"],
        )
        assert q[1] == Cut(0, 128 * tp_rank, 128) and o[1] == Cut(
            1, 128 * tp_rank, 128
        )  # 4 heads of 64, 2 each
        assert result["pieces"][layer + "self_attn.k_proj.weight"][1] == Cut(
            0, 0, 64
        )  # 1 KV head: replicated
        assert result["pieces"][layer + "input_layernorm.weight"][1] is None
