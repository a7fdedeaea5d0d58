"""Where an RL step's samples come from: one `RolloutSource` per trainer.async_mode, picked once by
`rollout_source` in tandem/trainer/ppo.py, and one call from the step, `next(step, timer)`.

    synchronous    tandem/trainer/sync_source.py     generate now (rounds of DAPO dynamic sampling)
    one_step_off   tandem/trainer/one_step_off.py    take what was launched last step, launch the next
    streaming      tandem/trainer/streaming.py       take the first groups to finish on the rollout pool

A source draws, generates and scores through the run's `Rollouts` (tandem/trainer/rollouts.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from tandem.batch import Batch
    from tandem.trainer.metrics import Timer
    from tandem.trainer.rollouts import Rollouts


class RolloutSource(ABC):
    """The samples of each training step, scored. The step's `Timer` comes with each call, not at
    construction: the trainer makes a new one per step, whose seconds are that step's phases."""

    # a step's prompts are drawn when the step starts, after the previous step trained (a curriculum sampler's
    # update() can change them); False: drawn earlier, while a previous step runs
    draws_after_update: ClassVar[bool] = True

    def __init__(self, rollouts: Rollouts, total_steps: int) -> None:
        self.rollouts = rollouts
        self.total_steps = total_steps  # the run's last step: nothing is generated for after it

    @abstractmethod
    def next(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """Step `step`'s samples with `token_level_scores`, and the step's rollout metrics; `timer` times
        the phases (generate, wait_generate, reward)."""

    def sampler_state(self) -> dict[str, Any]:
        """What a checkpoint records of the sampler: by default its position now."""
        return self.rollouts.sampler_state()

    def state_dict(self) -> dict[str, Any] | None:
        """The source's own checkpoint state; None: it keeps none."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore what state_dict returned."""
