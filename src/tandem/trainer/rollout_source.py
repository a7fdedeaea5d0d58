"""Where an RL step's samples come from: one `RolloutSource` per trainer.async_mode, picked once by
`rollout_source` in tandem/trainer/ppo.py, and one call from the step, `next(step, timer)`.

    synchronous    tandem/trainer/sync_source.py     generate now (rounds of DAPO dynamic sampling)
    one_step_off   tandem/trainer/one_step_off.py    take what was launched last step, launch the next
    streaming      tandem/trainer/streaming.py       take the first groups to finish on the rollout pool

A source asks the trainer for its data, generation and scoring through `RolloutServices` (the RL
trainer provides them), so the sources need not import the trainer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tandem.batch import Batch
    from tandem.config.schema import TandemConfig
    from tandem.controller import WorkerGroup
    from tandem.data import StatefulSampler
    from tandem.roles.layout import WorkerGroups
    from tandem.rollout import SamplingParams
    from tandem.trainer.metrics import Timer


class RolloutServices(Protocol):
    """What a rollout source uses of the RL trainer (tandem/trainer/ppo.py)."""

    cfg: TandemConfig
    sampler: StatefulSampler
    groups: WorkerGroups | None
    total_steps: int
    actor_updates: int  # the actor's update count: the version of the weights a generation starts from

    def next_indices(self) -> list[int]:
        """The next batch of training-data rows."""
        ...

    def train_prompts(self, indices: list[int]) -> Batch:
        """The training-data rows `indices`, collated as prompts."""
        ...

    def generation_request(self, prompts: Batch, step: int, round_: int) -> tuple[Batch, SamplingParams]:
        """The prompts with their index and uid, and the sampling of the step that trains on them."""
        ...

    def rollout_group(self) -> WorkerGroup:
        """The worker group that generates, holding the actor's current weights."""
        ...

    def score(self, batch: Batch, *, train: bool = False) -> tuple[Batch, dict[str, float]]:
        """The samples with `token_level_scores`, and the reward metrics."""
        ...

    def concat(self, batches: list[Batch]) -> Batch:
        """Rollout batches as one, their prompts left-padded to the widest."""
        ...


class RolloutSource(ABC):
    """The samples of each training step, scored. The step's `Timer` comes with each call, not at
    construction: the trainer makes a new one per step, whose seconds are that step's phases."""

    def __init__(self, trainer: RolloutServices) -> None:
        self.trainer = trainer

    @abstractmethod
    def next(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """Step `step`'s samples with `token_level_scores`, and the step's rollout metrics; `timer` times
        the phases (generate, wait_generate, reward)."""

    def sampler_state(self) -> dict[str, Any]:
        """What a checkpoint records of the sampler: by default its position now."""
        return self.trainer.sampler.state_dict()

    def state_dict(self) -> dict[str, Any] | None:
        """The source's own checkpoint state; None: it keeps none."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore what state_dict returned."""
