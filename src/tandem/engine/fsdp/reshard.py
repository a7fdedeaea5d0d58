"""From row shards to any rank's chosen part: each rank holds consecutive rows of a tensor (FSDP2's dim-0
shards) and wants a slice of the whole tensor along dim 0 or 1 (its `Cut`); one all-to-all delivers
every rank exactly its slice, nothing more (`gather_cut`). Used for the shard-only weight sync into a
tensor-parallel rollout engine (models/tp_cuts.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from tandem.models.tp_cuts import Cut


def chunk_rows(rows: int, world_size: int) -> list[tuple[int, int]]:
    """The [start, end) rows of each rank under torch.chunk (FSDP2's Shard(0)): ceil(rows / world) each,
    the last ranks fewer or none."""
    size = -(-rows // world_size)
    return [(min(r * size, rows), min((r + 1) * size, rows)) for r in range(world_size)]


def _block(local: Tensor, held: tuple[int, int], cut: Cut | None) -> Tensor:
    """The part of this rank's rows `held` (global [start, end)) that the cut wants, in its order."""
    if cut is None:
        return local
    if cut.dim == 1:
        return local.narrow(1, cut.start, cut.length)
    lo, hi = max(cut.start, held[0]), min(cut.start + cut.length, held[1])
    return local[max(lo - held[0], 0) : max(hi - held[0], 0)]


def gather_cut(local: Tensor, shape: tuple[int, ...], cuts: list[Cut | None], group: Any = None) -> Tensor:
    """This rank's cut of the whole tensor of `shape`, from every rank's rows (`local`: this rank's
    `chunk_rows` share). `cuts`: every rank's cut (None: the whole tensor), the same list on every rank.
    Collective over `group`; each rank receives its cut's elements and no others."""
    world, me = dist.get_world_size(group), dist.get_rank(group)
    held = chunk_rows(shape[0], world)
    if local.shape[0] != held[me][1] - held[me][0]:
        raise RuntimeError(
            f"gather_cut: rank {me} holds {local.shape[0]} rows of {tuple(shape)}, not the "
            f"{held[me][1] - held[me][0]} of an even dim-0 split over {world} ranks"
        )
    send = [_block(local, held[me], cut).reshape(-1) for cut in cuts]
    # what each rank p sends me: the shape of its block of my cut (its rows are known from the split)
    parts = [
        _block(torch.empty((hi - lo, *shape[1:]), device="meta"), (lo, hi), cuts[me]).shape for lo, hi in held
    ]
    sizes = [part.numel() for part in parts]
    received = local.new_empty(sum(sizes))
    dist.all_to_all_single(
        received,
        torch.cat(send),
        output_split_sizes=sizes,
        input_split_sizes=[b.numel() for b in send],
        group=group,
    )
    blocks = [flat.view(part) for flat, part in zip(received.split(sizes), parts, strict=True)]
    return torch.cat(blocks, dim=0)  # row blocks in rank order: rank order is row order
