"""A batch sampler whose position can be saved and restored, so a resumed run sees the same data."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


class StatefulSampler:
    """Yields lists of item indices, one epoch per ``iter()``.

    Each epoch's order is a permutation drawn from ``(seed, epoch)``, so it does not depend on
    how many epochs came before. ``state_dict()`` holds (epoch, position): the next epoch to
    draw from and the number of its batches already handed out. After the last batch of an
    epoch the state moves to (epoch + 1, 0) at once, so a checkpoint saved there resumes with the
    next epoch. A sampler restored with ``load_state_dict`` yields exactly the batches the
    original would have yielded next.
    """

    def __init__(
        self, num_items: int, batch_size: int, *, shuffle: bool = True, seed: int = 0, drop_last: bool = True
    ) -> None:
        if num_items < 1:
            raise ValueError(f"the dataset is empty (num_items={num_items}); give it some rows")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and num_items < batch_size:
            raise ValueError(
                f"the dataset has {num_items} items, fewer than one batch of {batch_size}, so with "
                f"drop_last every epoch is empty; lower data.train_batch_size or add data"
            )
        self.num_items = num_items
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        if self.drop_last:
            return self.num_items // self.batch_size
        return -(-self.num_items // self.batch_size)

    def order(self, epoch: int) -> list[int]:
        """All item indices in the order epoch ``epoch`` visits them."""
        if not self.shuffle:
            return list(range(self.num_items))
        # Seeding with the pair keeps (seed=0, epoch=1) and (seed=1, epoch=0) apart.
        return np.random.default_rng((self.seed, epoch)).permutation(self.num_items).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order(self.epoch)
        num_batches = len(self)
        while self.position < num_batches:
            start = self.position * self.batch_size
            batch = order[start : start + self.batch_size]
            self.position += 1
            if self.position == num_batches:
                self.epoch, self.position = self.epoch + 1, 0
                yield batch
                return
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "num_items": self.num_items,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore (epoch, position); refuses a state saved with a different dataset or settings,
        since its position would then point at other data."""
        if state.get("kind") == "user_sampler":  # data/user_sampler.py's
            raise ValueError(
                f"cannot resume the data sampler: the checkpoint's data order was saved by your sampler class "
                f"'{state.get('class')}' (data.sampler_class); set it again, or start without resuming"
            )
        for key in ("num_items", "batch_size", "shuffle", "seed", "drop_last"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume the data sampler: it was saved with {key}={state[key]!r} but now has "
                    f"{key}={getattr(self, key)!r}; restore the original setting or start without resuming"
                )
        position = int(state["position"])
        if not 0 <= position < len(self):
            raise ValueError(f"sampler state position {position} is outside an epoch of {len(self)} batches")
        self.epoch, self.position = int(state["epoch"]), position
