"""How one controller call becomes per-rank calls, and how the ranks' outputs become one result.

Worker methods carry their mode with `@dispatch(Dispatch.DP)`; undecorated methods are ONE_TO_ALL.
A method may also say how its rows are grouped into the parts (`@dispatch(Dispatch.MP, parts=...)`):
the worker side then owns both how a batch is arranged over its ranks and how each rank cuts its share.
Everything here is pure (no Ray, no processes): `plan_call` cuts the arguments, `CallPlan.gather`
puts the outputs back together.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tandem.batch import Batch, Partition
from tandem.controller.errors import DispatchError

F = TypeVar("F", bound=Callable[..., Any])
# (the call's first Batch argument, the number of parts, the call's keyword arguments) -> the row indices
# of each part, each row once; the parts' outputs are merged back into row order
PartsFn = Callable[[Batch, int, Mapping[str, Any]], Sequence[Sequence[int]]]

_MODE_ATTR = "__tandem_dispatch__"
_PARTS_ATTR = "__tandem_dispatch_parts__"


class Dispatch(enum.Enum):
    """How a worker-group call is spread over the ranks and collected."""

    ONE_TO_ALL = "one_to_all"  # same arguments to every rank; a list of the ranks' outputs, rank order
    RANK_ZERO = "rank_zero"  # same arguments to every rank (collectives need all); rank 0's output
    DP = "dp"  # Batch arguments split over the ranks; outputs merged back into the original row order
    MP = "mp"  # Batch arguments split over the data-parallel groups (`dispatch_info`); collectors' outputs merged
    # Batch arguments split over the rollout replicas (`replica_info`: the ranks of one tensor-parallel
    # inference engine get the same rows); collectors' outputs merged
    REPLICA = "replica"


# The worker method that answers (part, parts, collect) for each layout-driven mode.
LAYOUT_METHODS = {Dispatch.MP: "dispatch_info", Dispatch.REPLICA: "replica_info"}


def dispatch(mode: Dispatch, parts: PartsFn | None = None) -> Callable[[F], F]:
    """Mark a worker method with its dispatch mode: `@dispatch(Dispatch.DP)`. `parts` (DP / MP / REPLICA):
    which rows each part gets; without it, even contiguous slices (`Batch.chunk`)."""
    if not isinstance(mode, Dispatch):
        raise TypeError(
            f"dispatch() takes a Dispatch mode, got {mode!r}; write @dispatch(Dispatch.DP), not @dispatch"
        )
    if parts is not None and mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO):
        raise TypeError(
            f"dispatch(Dispatch.{mode.name}) sends every rank the same arguments: it takes no parts"
        )

    def mark(fn: F) -> F:
        setattr(fn, _MODE_ATTR, mode)
        setattr(fn, _PARTS_ATTR, parts)
        return fn

    return mark


def dispatch_mode(method: Callable[..., Any]) -> Dispatch:
    """The mode `method` was marked with; ONE_TO_ALL when it was not decorated."""
    return getattr(method, _MODE_ATTR, Dispatch.ONE_TO_ALL)


def dispatch_parts(method: Callable[..., Any]) -> PartsFn | None:
    """How `method`'s rows are grouped into parts (`dispatch(mode, parts)`); None: even contiguous slices."""
    return getattr(method, _PARTS_ATTR, None)


@dataclass(frozen=True)
class RankLayout:
    """Which data-parallel part each rank receives and which rank returns each part's output."""

    dp_ranks: tuple[int, ...]  # per rank: the index of the part it receives
    dp_size: int  # number of parts
    collectors: tuple[int, ...]  # per part, in part order: the rank whose output is kept

    @property
    def world_size(self) -> int:
        return len(self.dp_ranks)

    @classmethod
    def data_parallel(cls, world_size: int) -> RankLayout:
        """Every rank its own part, every rank collected."""
        ranks = tuple(range(world_size))
        return cls(ranks, world_size, ranks)

    @classmethod
    def from_dispatch_info(
        cls, infos: Sequence[Any], group: str = "worker group", method: str = "dispatch_info"
    ) -> RankLayout:
        """Build and check a layout from every rank's `dispatch_info()` (or `replica_info()`, named by
        `method`) = (dp_rank, dp_size, collect)."""
        if not infos:
            raise DispatchError(f"{group}: no ranks to build a model-parallel layout from")
        for rank, info in enumerate(infos):
            ok = (
                isinstance(info, tuple | list)
                and len(info) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) for v in info[:2])
                and isinstance(info[2], bool)
            )
            if not ok:
                raise DispatchError(
                    f"{group}: rank {rank}'s {method}() returned {info!r}; "
                    "it must return (dp_rank: int, dp_size: int, collect: bool)"
                )
        sizes = sorted({info[1] for info in infos})
        if len(sizes) != 1 or sizes[0] < 1:
            per_rank = {rank: info[1] for rank, info in enumerate(infos)}
            raise DispatchError(
                f"{group}: ranks disagree on dp_size or it is < 1 (rank: dp_size {per_rank}); "
                "every rank must report the same data-parallel size"
            )
        dp_size = sizes[0]
        dp_ranks = tuple(info[0] for info in infos)
        bad = {rank: d for rank, d in enumerate(dp_ranks) if not 0 <= d < dp_size}
        if bad:
            raise DispatchError(
                f"{group}: dp_rank out of range 0..{dp_size - 1} on ranks (rank: dp_rank) {bad}"
            )
        empty = sorted(set(range(dp_size)) - set(dp_ranks))
        if empty:
            raise DispatchError(
                f"{group}: no rank has dp_rank {empty} (dp_size {dp_size}); "
                "their parts of the batch would be lost"
            )
        collectors = []
        for d in range(dp_size):
            members = [rank for rank, r in enumerate(dp_ranks) if r == d]
            chosen = [rank for rank in members if infos[rank][2]]
            if len(chosen) != 1:
                found = f"none of ranks {members}" if not chosen else f"ranks {chosen}"
                raise DispatchError(
                    f"{group}: data-parallel group {d} must have exactly one rank with collect=True "
                    f"(e.g. tensor-parallel rank 0 on the last pipeline stage); {found} said collect=True"
                )
            collectors.append(chosen[0])
        return cls(dp_ranks, dp_size, tuple(collectors))


RankCall = tuple[tuple[Any, ...], dict[str, Any]]  # one rank's (args, kwargs)


@dataclass(frozen=True)
class CallPlan:
    """One call spread over the ranks: each rank's arguments, and how to collect the outputs."""

    mode: Dispatch
    rank_calls: list[RankCall]
    layout: RankLayout | None = None  # DP / MP / REPLICA only
    partition: Partition | None = None  # DP / MP / REPLICA with Batch arguments: how the rows were split

    def gather(self, outputs: Sequence[Any]) -> Any:
        """Combine the ranks' outputs (rank order) into the call's result."""
        if len(outputs) != len(self.rank_calls):
            raise DispatchError(f"gather got {len(outputs)} outputs for {len(self.rank_calls)} ranks")
        if self.mode is Dispatch.ONE_TO_ALL:
            return list(outputs)
        if self.mode is Dispatch.RANK_ZERO:
            return outputs[0]
        assert self.layout is not None
        return merge_outputs([outputs[rank] for rank in self.layout.collectors], self.partition)


def merge_outputs(parts: Sequence[Any], partition: Partition | None) -> Any:
    """Data-parallel outputs in part order: Batches merged back into row order, all-None -> None, else a list."""
    if all(p is None for p in parts):
        return None
    is_batch = [isinstance(p, Batch) for p in parts]
    if all(is_batch):
        if partition is None:  # no Batch went in: the parts' rows simply follow each other
            return Batch.concat(parts)
        return partition.merge(parts)
    if any(is_batch):
        kinds = ", ".join(f"part {i}: {type(p).__name__}" for i, p in enumerate(parts))
        raise DispatchError(
            f"data-parallel outputs mix Batch and other values ({kinds}); every rank must return a Batch"
        )
    return list(parts)


def plan_call(
    mode: Dispatch,
    world_size: int,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    layout: RankLayout | None = None,
    parts: PartsFn | None = None,
) -> CallPlan:
    """Cut one call's arguments into per-rank calls; DP needs nothing more, MP and REPLICA need the group's
    `layout` for that mode. `parts` groups the rows into the parts (`dispatch`); by default even slices."""
    args, kwargs = tuple(args), dict(kwargs)
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO):
        return CallPlan(mode, [(args, kwargs) for _ in range(world_size)])
    if mode is Dispatch.DP:
        layout = RankLayout.data_parallel(world_size)
    elif layout is None:
        raise DispatchError(
            f"{mode.name} dispatch needs the group's RankLayout (from the workers' {LAYOUT_METHODS[mode]}())"
        )
    if layout.world_size != world_size:
        raise DispatchError(f"layout covers {layout.world_size} ranks, the group has {world_size}")

    batch_args = {("arg", i): a for i, a in enumerate(args) if isinstance(a, Batch)}
    batch_args.update({("kwarg", k): v for k, v in kwargs.items() if isinstance(v, Batch)})
    if not batch_args:
        return CallPlan(mode, [(args, kwargs) for _ in range(world_size)], layout)

    lengths = {where: len(b) for where, b in batch_args.items()}
    if len(set(lengths.values())) > 1:
        listing = ", ".join(
            f"{'argument ' + str(k) if kind == 'arg' else k}={n} rows" for (kind, k), n in lengths.items()
        )
        raise DispatchError(
            f"{mode.name} dispatch splits every Batch argument the same way, so they must have "
            f"the same number of rows; got {listing}"
        )
    groups = None
    if parts is not None:  # the rows of each part, chosen from the first Batch argument; every one cut alike
        groups = parts(next(iter(batch_args.values())), layout.dp_size, kwargs)
    cut, partition = {}, None
    for where, b in batch_args.items():
        cut[where], partition = b.chunk_with_plan(layout.dp_size) if groups is None else b.partition(groups)

    rank_calls = []
    for rank in range(world_size):
        d = layout.dp_ranks[rank]
        rank_args = tuple(cut[("arg", i)][d] if ("arg", i) in cut else a for i, a in enumerate(args))
        rank_kwargs = {k: cut[("kwarg", k)][d] if ("kwarg", k) in cut else v for k, v in kwargs.items()}
        rank_calls.append((rank_args, rank_kwargs))
    return CallPlan(mode, rank_calls, layout, partition)
