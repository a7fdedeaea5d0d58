"""The rollout engine interface: token ids in, token ids + sampling log-probs out.

Batch layout. `generate` takes a prompt Batch as `collate_prompts` builds it (LEFT-padded
`input_ids` [N, P], `attention_mask`, `position_ids`, per-sample non-tensors) and returns
N x n rows (each prompt's n samples next to each other, non-tensors repeated) holding:
  prompts            [N*n, P]    the prompt ids, left-padded as given
  responses          [N*n, R]    generated ids, R = sampling.max_tokens exactly; pad id after the stop
  response_mask      [N*n, R]    1 on generated tokens up to and including the stop token, else 0
  input_ids          [N*n, P+R]  prompts ++ responses
  attention_mask     [N*n, P+R]  the prompt's mask ++ response_mask
  position_ids       [N*n, P+R]  cumsum(attention_mask) - 1, clamped at 0
  rollout_log_probs  [N*n, R]    float32 log-prob of each generated token under the SAMPLING
                                 distribution: log_softmax(logits / temperature) (greedy: T = 1);
                                 top-k / top-p decide which tokens may be drawn but do not
                                 renormalise this number, so it equals what the trainer
                                 recomputes with the same temperature; 0 on padding
Masks are int64 like `collate_prompts`'; the meta dict is kept. An optional prompt tensor
`prompt_index` [N] (the prompt's index in the whole step, set before the data-parallel split)
keys seeded sampling, so that the samples do not depend on how prompts were split over ranks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

from torch import Tensor

from tandem.batch import Batch

PROMPT_INDEX = "prompt_index"

ROLLOUT_KEYS = (
    "prompts",
    "responses",
    "response_mask",
    "input_ids",
    "attention_mask",
    "position_ids",
    "rollout_log_probs",
)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. temperature 0 = greedy (then n must be 1)."""

    max_tokens: int  # TOKENS generated per sample at most (the width R of `responses`)
    n: int = 1  # SAMPLES per prompt
    temperature: float = 1.0  # > 0 samples; 0 = greedy
    top_p: float = 1.0  # nucleus mass in (0, 1]; 1 = off
    top_k: int = -1  # k >= 1 keeps the k most likely tokens; -1 = off
    seed: int | None = None  # same seed + same weights + same prompts = same samples

    def __post_init__(self) -> None:
        problems = []
        if self.max_tokens < 1:
            problems.append(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            problems.append(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            problems.append(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.temperature == 0 and self.n > 1:
            problems.append(
                f"greedy sampling (temperature 0) gives identical samples; n must be 1, got {self.n}"
            )
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            problems.append(f"top_k must be >= 1 or -1 (off), got {self.top_k}")
        if problems:
            raise ValueError("SamplingParams: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class RolloutEngine(ABC):
    """Generates responses. Implementations: `hf.py` (transformers), `vllm.py` (issue 5)."""

    @abstractmethod
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """Sample `sampling.n` responses per prompt; the returned layout is the module docstring's."""

    @abstractmethod
    def update_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Load new weights, given one (Hugging Face name, full tensor) at a time; consume lazily."""

    def sleep(self) -> None:  # noqa: B027 - a no-op is the right default for engines without memory to free
        """Free accelerator memory (weights and KV cache) while the trainer runs."""

    def wake(self) -> None:  # noqa: B027
        """Undo `sleep` before the next `update_weights` / `generate`."""
