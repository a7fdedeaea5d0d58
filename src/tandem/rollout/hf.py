"""A rollout engine over a plain Hugging Face causal LM: its own decode loop with a KV cache.

Slower than vLLM, but it runs anywhere transformers runs (CPU included), and every number it
reports comes from the same forward the trainer uses, so it is the reference the others are
checked against.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, PreTrainedModel

from tandem.batch import Batch
from tandem.models.config_overrides import apply_overrides
from tandem.rollout.base import (
    RolloutEngine,
    RolloutSpec,
    SamplingParams,
    assemble,
    check_prompts,
    refuse_images,
    sample_keys,
)
from tandem.rollout.sampling import choose_tokens, row_generators

logger = logging.getLogger(__name__)


class HFRollout(RolloutEngine):
    """Generates with a Hugging Face causal LM the engine owns (its own unsharded copy of the weights).

    Give either ``model_path`` (a local Hugging Face folder, loaded in ``dtype``) or ``model`` (an
    already built model; the engine takes it over and moves it to ``device`` / ``dtype`` in place).
    ``tokenizer_path`` is not read here: token ids go in and out (``from_pretrained`` reads the stop
    and pad ids from it); it is accepted so that every engine takes the same arguments.
    A sample stops after any of ``eos_token_ids`` (kept in the response, mask 1) or at
    ``sampling.max_tokens``; ``pad_token_id`` fills the rest. ``max_batch_size`` caps the rows decoded
    together (None: the whole batch at once); it changes speed and memory, not the samples.
    ``override_config``: attributes set on the folder's config before the model is built (the trainer's
    actor.override_config, so that the rollout runs the model the actor trains).

    ``generate`` returns the layout of :mod:`tandem.rollout.base` on the CPU, with
    ``meta["rollout_metrics"]``: ``samples`` (rows), ``prompt_tokens`` (prefilled, n copies of each
    prompt), ``generated_tokens`` (sum of response_mask), ``decode_steps`` (forward calls after the
    prefills, summed over chunks), ``seconds`` (wall clock of the call) and ``tokens_per_second``
    (generated_tokens / seconds).

    Seeded sampling draws each row from its own generator seeded by (seed, row key), so the samples
    depend on the seed, the weights and the prompts only, not on chunking (see `rollout.base.sample_keys`).
    The prompts' ``position_ids`` are not read: positions are recomputed from ``attention_mask``.
    """

    @classmethod
    def from_spec(cls, spec: RolloutSpec) -> HFRollout:
        """The model, tokenizer, device, dtype and override_config of the spec; its vLLM-sized fields (lengths,
        tensor_parallel, memory, engine_kwargs) have no meaning for transformers' generate."""
        return cls.from_pretrained(
            spec.model_path,
            **spec.common_kwargs(),
            override_config=dict(spec.override_config) if spec.override_config else None,
        )

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        tokenizer_path: str | Path | None = None,
        model: PreTrainedModel | None = None,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        max_batch_size: int | None = None,
        attn_implementation: str | None = None,
        override_config: dict[str, Any] | None = None,
    ) -> None:
        if (model_path is None) == (model is None):
            raise ValueError("HFRollout needs exactly one of model_path (a Hugging Face folder) or model")
        eos_token_ids = [int(t) for t in eos_token_ids]
        if not eos_token_ids:
            raise ValueError("HFRollout: eos_token_ids is empty; give the id(s) that end a response")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"HFRollout: max_batch_size must be >= 1 or None, got {max_batch_size}")
        self.device = torch.device(device)
        self.dtype = dtype
        if model is None:
            extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
            config = AutoConfig.from_pretrained(model_path, **extra)
            apply_overrides(config, override_config or {}, "actor.override_config")
            model = AutoModelForCausalLM.from_pretrained(model_path, config=config, dtype=dtype)
        elif override_config:
            raise ValueError(
                "HFRollout: override_config applies to a model built from model_path, not a given one"
            )
        self.model: PreTrainedModel = model.to(device=self.device, dtype=dtype).eval()
        self.model.requires_grad_(False)
        self.eos_token_ids = eos_token_ids
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = max_batch_size
        self._eos = torch.tensor(eos_token_ids, device=self.device)
        self._asleep = False
        self._logged_cpu_sleep = False

    # ---------------------------------------------------------------- generate
    @torch.no_grad()  # not inference_mode: its tensors would fail later when the trainer's autograd uses them
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        if self._asleep:
            raise RuntimeError("HFRollout.generate called while asleep; call wake() first")
        start = time.perf_counter()
        refuse_images(prompts, "HFRollout")
        prompt_ids, prompt_mask = check_prompts(prompts, "HFRollout")
        rows = prompts.repeat(sampling.n, interleave=True)
        prompt_ids = prompt_ids.repeat_interleave(sampling.n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(sampling.n, dim=0)

        keys = sample_keys(prompts, sampling.n)
        chunk = self.max_batch_size or len(rows)
        parts, steps = [], 0
        for first in range(0, len(rows), chunk):
            *part, n_steps = self._generate_chunk(
                prompt_ids[first : first + chunk],
                prompt_mask[first : first + chunk],
                keys[first : first + chunk],
                sampling,
            )
            parts.append(part)
            steps += n_steps
        response_ids, response_mask, rollout_log_probs = (torch.cat(p) for p in zip(*parts))
        seconds = time.perf_counter() - start
        return assemble(
            rows,
            prompt_ids,
            prompt_mask,
            response_ids,
            response_mask,
            rollout_log_probs,
            seconds,
            decode_steps=steps,
        )

    def _generate_chunk(
        self, prompt_ids: Tensor, prompt_mask: Tensor, row_keys: Tensor, sampling: SamplingParams
    ) -> tuple[Tensor, Tensor, Tensor, int]:
        """Responses [B, R] (pad after the stop), response mask and log-probs (0 after), on the CPU."""
        rows, width = prompt_ids.shape[0], sampling.max_tokens
        device = self.device
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        generators = None
        if not sampling.greedy and sampling.seed is not None:
            generators = row_generators(sampling.seed, row_keys, device)

        responses = torch.full((rows, width), self.pad_token_id, dtype=torch.long, device=device)
        response_mask = torch.zeros((rows, width), dtype=torch.long, device=device)
        log_probs = torch.zeros((rows, width), dtype=torch.float32, device=device)
        active = torch.ones(rows, dtype=torch.bool, device=device)
        next_position = prompt_mask.sum(dim=-1)  # left padding: a row's next position is its length
        attention_mask = prompt_mask

        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=prompt_ids,
            attention_mask=attention_mask,
            position_ids=(prompt_mask.cumsum(dim=-1) - 1).clamp(min=0),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,  # the prefill needs only the last position's logits
        )
        steps = 0
        for t in range(width):
            logits = out.logits[:, -1].float()
            tokens, token_log_probs = choose_tokens(logits, sampling, generators, active)
            responses[:, t] = torch.where(active, tokens, self.pad_token_id)
            log_probs[:, t] = torch.where(active, token_log_probs, 0.0)
            response_mask[:, t] = active.long()
            active = active & ~torch.isin(tokens, self._eos)
            if t == width - 1 or not bool(active.any()):
                break
            # A finished row keeps decoding a masked pad (its outputs are dropped): the batch stays whole.
            attention_mask = torch.cat([attention_mask, response_mask[:, t : t + 1]], dim=1)
            out = self.model(
                input_ids=responses[:, t : t + 1],
                attention_mask=attention_mask,
                position_ids=(next_position + t)[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            steps += 1
        return responses.cpu(), response_mask.cpu(), log_probs.cpu(), steps

    # ---------------------------------------------------------------- weights
    def update_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Copy each (name, tensor) into the parameter or buffer of that name, in place, one at a time.

        Tied names (``lm_head.weight`` and ``model.embed_tokens.weight``) share storage, so loading
        either updates both. Names are the model's ``state_dict`` names; an unknown name or a wrong
        shape raises at that tensor (the tensors before it stay loaded)."""
        targets = dict(self.model.named_parameters(remove_duplicate=False))
        targets.update(self.model.named_buffers(remove_duplicate=False))
        count, size = 0, 0
        with torch.no_grad():
            for name, tensor in weights:
                target = targets.get(name)
                if target is None:
                    known = ", ".join(sorted(targets)[:5])
                    raise KeyError(
                        f"HFRollout.update_weights: no parameter or buffer named {name!r} in the rollout "
                        f"model ({type(self.model).__name__}); names look like: {known}, ... "
                        f"(send the model's state_dict names, without wrapper prefixes)"
                    )
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"HFRollout.update_weights: {name!r} has shape {tuple(tensor.shape)}, the rollout "
                        f"model's has {tuple(target.shape)}; are trainer and rollout the same model?"
                    )
                # copy_ casts dtype and device on the way: no second full copy of the model exists.
                target.data.copy_(tensor)
                count += 1
                size += tensor.numel() * tensor.element_size()
        logger.debug("HFRollout.update_weights: loaded %d tensors, %.1f MiB", count, size / 2**20)

    # ---------------------------------------------------------------- memory
    def sleep(self) -> None:
        """Move the weights to the CPU and free the CUDA cache; a no-op on CPU."""
        if self.device.type != "cuda":
            if not self._logged_cpu_sleep:
                logger.info("HFRollout: sleep is a no-op on CPU")
                self._logged_cpu_sleep = True
            return
        if not self._asleep:
            self.model.to("cpu")
            torch.cuda.empty_cache()
            self._asleep = True

    def wake(self) -> None:
        """Move the weights back to the engine's device after `sleep`."""
        if self._asleep:
            self.model.to(self.device)
            self._asleep = False
