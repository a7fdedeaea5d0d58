"""The rollout engine interface: token ids in, token ids + sampling log-probs out.

Batch layout. `generate` takes a prompt Batch as `collate_prompts` builds it (LEFT-padded
`input_ids` [N, P], `attention_mask`, `position_ids`, per-sample non-tensors) and returns
N x n rows (each prompt's n samples next to each other, non-tensors repeated) holding:
  prompts            [N*n, P]    the prompt ids, left-padded as given
  responses          [N*n, R]    generated ids, R = sampling.max_tokens exactly; pad id after the stop
  response_mask      [N*n, R]    1 on generated tokens up to and including the stop token, else 0
                                 (multi-turn: 0 also on the tokens tools / users inserted)
  input_ids          [N*n, P+R]  prompts ++ responses
  attention_mask     [N*n, P+R]  the prompt's mask ++ response_mask (multi-turn: ++ 1 on every
                                 token of the trajectory, inserted ones included)
  position_ids       [N*n, P+R]  cumsum(attention_mask) - 1, clamped at 0
  rollout_log_probs  [N*n, R]    float32 log-prob of each generated token under the SAMPLING
                                 distribution: log_softmax(logits / temperature) (greedy: T = 1);
                                 top-k / top-p decide which tokens may be drawn but do not
                                 renormalise this number, so it equals what the trainer
                                 recomputes with the same temperature; 0 on padding
Masks are int64 like `collate_prompts`'; the meta dict is kept. An optional prompt tensor
`prompt_index` [N] (the prompt's index in the whole step, set before the data-parallel split)
keys seeded sampling, so that the samples do not depend on how prompts were split over ranks.

Every engine is built from one `RolloutSpec` (what to build: the model folder, device, dtype, lengths, the
engine's own arguments), made once from the config (roles/rollout.py `rollout_spec`, `tandem generate`'s
own), and checked before any worker starts by its class's `check_buildable(spec)`.

Besides the interface, the helpers every engine and the agent loop share: `assemble` (the layout
above), `check_prompts`, `sample_keys` / `request_seed` (seeding), `refuse_images`, `read_special_ids`.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import torch
from torch import Tensor

from tandem.batch import Batch

PROMPT_INDEX = "prompt_index"
METRICS_KEY = "rollout_metrics"  # the meta entry of a generate call's numbers (see `assemble`)


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


@dataclass(frozen=True)
class RolloutSpec:
    """One description of a rollout engine to build, whichever engine: each takes the fields it uses
    (`RolloutEngine.from_spec`) and ignores the rest. Unlike verl, whose rollout config section is handed
    to every engine whole, the spec holds resolved values (the engine's name, the dtype, the length), so
    the start-up check and the engine read the same ones."""

    engine: str  # the engine's name in tandem.rollout's ROLLOUT_ENGINES (resolved: never "auto")
    model_path: str | Path
    tokenizer_path: str | Path | None = None  # None: the model folder's tokenizer
    device: torch.device | None = None  # None: not chosen yet (the start-up check under trainer.device=auto)
    dtype: torch.dtype = torch.float32  # weights and compute
    override_config: Mapping[str, Any] | None = None  # set on the model's HF config (actor.override_config)
    max_model_len: int = 2048  # prompt + response tokens a sequence may hold
    tensor_parallel: int = 1  # ranks one engine spans
    gpu_memory_utilization: float = 0.5  # share of a GPU's memory the engine may take
    kv_cache_gib: int = 1  # GiB of KV cache on a CPU
    seed: int = 0  # the engine's own seed (a sampling seed keys the draws)
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)  # the engine's own arguments, passed on
    lora_rank: int = 0  # > 0: serve LoRA adapters of this rank (actor.lora.rollout_sync=adapter)
    eos_token_ids: Sequence[int] | None = None  # None: read from the folder (`read_special_ids`)
    pad_token_id: int | None = None  # None: read from the folder

    def common_kwargs(self) -> dict[str, Any]:
        """What every engine's `from_pretrained` takes of the spec besides the model folder: the tokenizer, the
        end and pad ids, the device (cpu until chosen) and the dtype."""
        return {
            "tokenizer_path": self.tokenizer_path,
            "eos_token_ids": self.eos_token_ids,
            "pad_token_id": self.pad_token_id,
            "device": self.device or "cpu",
            "dtype": self.dtype,
        }


class RolloutEngine(ABC):
    """Generates responses. Implementations: `hf.py` (transformers), `vllm.py` (vLLM), registered by name
    in tandem.rollout's ROLLOUT_ENGINES; callers hold this face and never ask which engine it is: what an
    engine can do is in tandem/rollout_options.py by name."""

    eos_token_ids: list[int]  # the ids that end a response
    pad_token_id: int  # the id after a response's end

    @classmethod
    def from_spec(cls, spec: RolloutSpec) -> Self:
        """The engine `spec` describes; an engine overrides it to take the fields it uses (the default
        takes the model, tokenizer, device and dtype)."""
        return cls.from_pretrained(
            spec.model_path,
            **spec.common_kwargs(),
        )

    @staticmethod
    def check_buildable(spec: RolloutSpec) -> list[str]:
        """What this engine could not build from `spec`, read before any worker starts (without importing the
        engine's library): one line per problem naming the key or field; [] when it builds."""
        return []

    @classmethod
    def from_pretrained(
        cls,
        model_path: str | Path,
        *,
        tokenizer_path: str | Path | None = None,
        eos_token_ids: Sequence[int] | None = None,
        pad_token_id: int | None = None,
        **kwargs: Any,
    ) -> Self:
        """Start the engine on a Hugging Face folder; stop and pad ids not given are read from it and
        from the tokenizer in `tokenizer_path` (None = `model_path`; see `read_special_ids`); `kwargs`
        go to the engine's constructor."""
        if eos_token_ids is None or pad_token_id is None:
            found_eos, found_pad = read_special_ids(model_path, tokenizer_path)
            eos_token_ids = found_eos if eos_token_ids is None else eos_token_ids
            pad_token_id = found_pad if pad_token_id is None else pad_token_id
        return cls(
            model_path,
            tokenizer_path=tokenizer_path,
            eos_token_ids=eos_token_ids,
            pad_token_id=pad_token_id,
            **kwargs,
        )

    @abstractmethod
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """Sample `sampling.n` responses per prompt; the returned layout is the module docstring's."""

    @abstractmethod
    def update_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Load new weights, given one (Hugging Face name, full tensor) at a time; consume lazily."""

    def turn_engine(self) -> Any:
        """A `rollout.async_engine.TurnEngine` on this engine, for the agent loop (rollout.mode=async)."""
        raise NotImplementedError(
            f"{type(self).__name__} has no asynchronous turn engine; rollout.mode=async needs rollout.engine=vllm"
        )

    def load_adapter(self, folder: str | Path) -> None:
        """Serve the LoRA adapter in a PEFT `folder` from now on, over the base weights it loaded
        (actor.lora.rollout_sync=adapter)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not serve LoRA adapters; actor.lora.rollout_sync=adapter needs "
            "rollout.engine=vllm (or use rollout_sync=merged)"
        )

    def sleep(self) -> None:  # noqa: B027 - a no-op is the right default for engines without memory to free
        """Free accelerator memory (weights and KV cache) while the trainer runs."""

    def wake(self) -> None:  # noqa: B027
        """Undo `sleep` before the next `update_weights` / `generate`."""


def refuse_images(prompts: Batch, engine: str) -> None:
    """A clear error where an engine would drop a vision-language prompt's images and generate from text."""
    images = prompts.get("multi_modal_data")  # a column of objects (None for a row without images)
    if images is not None and any(row is not None for row in images):
        raise ValueError(
            f"{engine}: prompts with images are generated by the vLLM engine's batched generate only "
            "(rollout.engine=vllm, rollout.mode=sync)"
        )


def assemble(
    rows: Batch,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    responses: Tensor,
    response_mask: Tensor,
    log_probs: Tensor,
    seconds: float,
    trajectory_mask: Tensor | None = None,
    **metrics: float,
) -> Batch:
    """Fill `rows` (the prompts repeated n times, interleaved) with the layout of this module's
    docstring from the [N*n, ...] prompt and response tensors, and put the call's numbers in
    meta[METRICS_KEY]: samples, prompt_tokens, generated_tokens, seconds, tokens_per_second and
    the engine's own `metrics`. ``trajectory_mask`` (multi-turn, rollout/agent.py) is 1 on every
    response token, generated or inserted: the attention mask's response part, where
    ``response_mask`` is 1 on generated tokens only; None = ``response_mask``."""
    if trajectory_mask is None:
        trajectory_mask = response_mask
    attention_mask = torch.cat([prompt_mask, trajectory_mask], dim=1)
    out = {
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=-1) - 1).clamp(min=0),
        "rollout_log_probs": log_probs,
    }
    for key, value in out.items():
        rows[key] = value
    generated = int(response_mask.sum())
    rows.meta = {
        **rows.meta,
        METRICS_KEY: {
            "samples": len(rows),
            "prompt_tokens": int(prompt_mask.sum()),
            "generated_tokens": generated,
            **metrics,
            "seconds": seconds,
            "tokens_per_second": generated / seconds if seconds > 0 else 0.0,
        },
    }
    return rows


def read_special_ids(
    model_path: str | Path, tokenizer_path: str | Path | None = None, tokenizer: Any = None
) -> tuple[list[int], int]:
    """Stop ids and pad id of a Hugging Face folder (its tokenizer read from `tokenizer_path` when given, or
    `tokenizer` itself when the caller has already loaded it from there).

    Stop ids: ``generation_config.json``'s ``eos_token_id`` (an int or a list; else ``config.json``'s),
    plus the tokenizer's ``eos_token_id`` when not already there. Pad: the tokenizer's ``pad_token_id``,
    else the generation config's / config's ``pad_token_id``, else the first stop id.
    """
    from transformers import AutoConfig, AutoTokenizer  # the tokenizer load is only needed here

    path = Path(model_path)
    generation_config = {}
    if (path / "generation_config.json").is_file():
        generation_config = json.loads((path / "generation_config.json").read_text())
    config = AutoConfig.from_pretrained(path)
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(path if tokenizer_path is None else Path(tokenizer_path))

    eos = generation_config.get("eos_token_id", getattr(config, "eos_token_id", None))
    eos_ids = [] if eos is None else [int(t) for t in (eos if isinstance(eos, list) else [eos])]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.append(int(tokenizer.eos_token_id))
    if not eos_ids:
        raise ValueError(
            f"{path}: no eos_token_id in generation_config.json, config.json or the tokenizer; "
            f"pass eos_token_ids to the engine's from_pretrained"
        )
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = generation_config.get("pad_token_id", getattr(config, "pad_token_id", None))
    return eos_ids, int(eos_ids[0] if pad is None else pad)


def check_prompts(prompts: Batch, engine: str) -> tuple[Tensor, Tensor]:
    """The prompt ids and mask (int64, CPU), after checking they are left-padded and non-empty; `engine`
    names the caller in the errors."""
    for key in ("input_ids", "attention_mask"):
        if key not in prompts:
            raise KeyError(f"{engine}.generate: the prompt batch has no {key!r} (collate_prompts builds it)")
    if len(prompts) == 0:
        raise ValueError(f"{engine}.generate: the prompt batch is empty")
    ids = prompts["input_ids"].long().cpu()
    mask = prompts["attention_mask"].long().cpu()
    if ids.shape != mask.shape or ids.dim() != 2:
        raise ValueError(
            f"{engine}.generate: input_ids {tuple(ids.shape)} and attention_mask {tuple(mask.shape)} "
            "must be the same [N, P] shape"
        )
    if not bool(mask[:, -1].all()):
        bad = (mask[:, -1] == 0).nonzero().flatten()[:5].tolist()
        raise ValueError(
            f"{engine}.generate: prompts must be LEFT-padded with at least one token (attention_mask "
            f"ending in 1); rows {bad} are not. Use collate_prompts or a left-padding tokenizer."
        )
    return ids, mask


def sample_keys(prompts: Batch, n: int) -> Tensor:
    """The key of each of the N x n samples that seeds its draws: prompt_index x n + sample number.

    `prompt_index` (int [N], optional) is the prompt's index in the whole step, set by the controller
    before the data-parallel split, so that seeded samples do not depend on how the prompts were
    split over ranks. Without it the prompts' positions in this batch (0..N-1) stand in.
    """
    if PROMPT_INDEX in prompts:
        index = prompts[PROMPT_INDEX].long().reshape(-1)
    else:
        index = torch.arange(len(prompts))
    return (index[:, None] * n + torch.arange(n)[None, :]).reshape(-1)


def request_seed(seed: int, key: int) -> int:
    """The seed of one prompt's request: depends on the step's seed and the prompt's global index only
    (`key`, from `sample_keys`); the vLLM engine and the agent loop seed a prompt's samples from it."""
    return (seed * 1_000_003 + key) % (2**31 - 1)
