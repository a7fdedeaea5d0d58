"""Small worker classes for the controller tests (real torch.distributed, tiny tensors)."""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tandem.batch import Batch
from tandem.controller import Dispatch, Worker, WorkerContext, dispatch


class ToyWorker(Worker):
    """Scores rows (x * scale + offset), reports where it runs; `tp` > 1 fakes tensor-parallel ranks."""

    def __init__(self, ctx: WorkerContext, scale: float = 1.0, tp: int = 1) -> None:
        super().__init__(ctx)
        self.scale = scale
        self.tp = tp

    def dispatch_info(self) -> tuple[int, int, bool]:
        return self.ctx.rank // self.tp, self.ctx.world_size // self.tp, self.ctx.rank % self.tp == 0

    def info(self) -> dict:
        env = {
            k: os.environ.get(k)
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "OMP_NUM_THREADS")
        }
        return {
            "rank": self.ctx.rank,
            "world_size": self.ctx.world_size,
            "backend": self.ctx.backend,
            "ctx_threads": self.ctx.num_threads,
            "torch_threads": torch.get_num_threads(),
            "dist_world_size": dist.get_world_size(),
            "env": env,
            "pid": os.getpid(),
        }

    def rank_sum(self) -> float:
        """All-reduce of (rank + 1): proves the ranks share one process group."""
        t = torch.tensor([float(self.ctx.rank + 1)])
        dist.all_reduce(t)
        return t.item()

    @dispatch(Dispatch.RANK_ZERO)
    def rank_sum_once(self) -> float:
        return self.rank_sum()

    @dispatch(Dispatch.DP)
    def score(self, batch: Batch, offset: float = 0.0) -> Batch:
        out = Batch(
            {"score": batch["x"] * self.scale + offset, "rank": torch.full((len(batch),), self.ctx.rank)},
            {"uid": batch["uid"]},
        )
        return out

    @dispatch(Dispatch.DP)
    def count_rows(self, batch: Batch, other: Batch) -> int:
        return len(batch) + len(other)

    @dispatch(Dispatch.DP)
    def consume(self, batch: Batch) -> None:
        batch.pop("x")  # mutates the worker's own copy only

    @dispatch(Dispatch.MP)
    def score_mp(self, batch: Batch) -> Batch:
        """Every rank of a data-parallel group sees the same rows (the all-reduce checks it)."""
        rows = torch.tensor([float(len(batch))])
        dist.all_reduce(rows)
        out = self.score(batch)
        out["rows_all_ranks"] = torch.full((len(batch),), rows.item())
        return out

    @dispatch(Dispatch.REPLICA)
    def score_replica(self, batch: Batch) -> Batch:
        """Split by replica_info (the base class's: every rank its own part), whatever dispatch_info says."""
        return self.score(batch)

    def fail(self, message: str) -> int:
        if self.ctx.rank == self.ctx.world_size - 1:
            raise ValueError(f"rank {self.ctx.rank} says: {message}")
        return self.ctx.rank

    def exit_or_all_reduce(self) -> float:
        """The last rank's process exits at once; the others block in an all-reduce that cannot finish."""
        if self.ctx.rank == self.ctx.world_size - 1:
            os._exit(1)
        return self.rank_sum()

    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.ctx.rank

    def wait_for_file(self, path: str, timeout_s: float) -> bool:
        """True when `path` appears within `timeout_s` (another group's call creates it)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if Path(path).exists():
                return True
            time.sleep(0.05)
        return False

    def touch(self, path: str) -> None:
        Path(path).touch()


class BrokenInit(Worker):
    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        if ctx.rank == ctx.world_size - 1:
            raise RuntimeError("cannot load the model")

    def noop(self) -> None:
        return None


def pids_still_there(pids: list[int], timeout_s: float = 15.0) -> list[int]:
    """The pids that still have a /proc entry (running or zombie) after waiting up to `timeout_s`."""
    end = time.monotonic() + timeout_s
    while True:
        left = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)
