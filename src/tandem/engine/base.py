"""The training-engine interface the roles are written against (FSDP2 and megatron-core).

Batch layout the engines read (see tandem/rollout/base.py): `input_ids`, `attention_mask`,
`position_ids` [B, T]. A role's `fn` / `loss_fn` gets a `ModelOutput` for one micro-batch and
that micro-batch; it reads the outputs at the padded positions it needs with `ModelOutput.at`,
so the same role code runs on padded and on packed micro-batches (tandem/data/packing.py).

Micro-batches: `micro_batch_size` samples each, or, when the engine has a token budget
(`max_tokens_per_micro_batch`), as few micro-batches as hold the rows' tokens under the budget,
balanced in tokens and with the same count on every rank; `forward` returns rows in input order.

Loss contract (tandem/algos/aggregation.py): `loss_fn` returns this micro-batch's CONTRIBUTION
to the loss of the global mini-batch, normalised by global counts; the engine sums contributions
over micro-batches and data-parallel ranks (it scales by the data-parallel size to undo the
averaging of the gradient reduction). Every rank must call `forward` / `train_step` together:
the engine pads ranks with fewer micro-batches with dummy passes that contribute nothing.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor

from tandem.batch import Batch
from tandem.config.schema import FSDPConfig, LoraConfig, MegatronConfig, OptimConfig, Strategy
from tandem.data.packing import Packing
from tandem.engine.auto_dtype import cpu_auto_dtype
from tandem.engine.lm_head import ChunkedHead
from tandem.models.tp_cuts import Cut

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
Head = Literal["lm", "value"]  # causal LM (actor, reference) or a 1-wide token head (critic, reward model)
# (model output, micro-batch) -> per-row tensors; -> (this micro-batch's loss contribution, metrics)
ForwardFn = Callable[["ModelOutput", Batch], dict[str, Tensor]]
LossFn = Callable[["ModelOutput", Batch], tuple[Tensor, dict[str, float]]]


def resolve_param_dtype(
    param_dtype: str, device: torch.device, key: str = "fsdp.param_dtype", cpu_probe: bool = True
) -> torch.dtype:
    """A config's compute dtype -> torch dtype. "auto" is bfloat16 on CUDA; on a CPU, bfloat16 where this
    CPU's bf16 matmuls are clearly the faster (engine/auto_dtype.py), else float32 (always float32 with
    `cpu_probe=False`). Ranks of one engine must agree: the FSDP2 engine reduces their choices."""
    if param_dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        return cpu_auto_dtype() if cpu_probe else torch.float32
    if param_dtype not in DTYPES:
        raise ValueError(f"{key}={param_dtype!r} is unknown; use auto, {', '.join(DTYPES)}")
    return DTYPES[param_dtype]


@dataclass
class ModelOutput:
    """A micro-batch's model outputs. `logits`: [b, T, vocab] for a causal LM, [b, T, 1] for a value
    head, in the padded layout; [rows, width, ...] when `packing` is set (packed sequences)."""

    logits: Tensor
    shape: tuple[int, int]  # (b, T) of the padded micro-batch
    packing: Packing | None = None
    # Set when `logits` is this rank's slice of a tensor-parallel vocabulary: its `log_probs(logits, labels)`
    # and `entropy(logits)` reduce over the slices (engine/megatron/vocab_parallel.py).
    vocab_parallel: Any = None
    # Set when `logits` holds the last hidden states [.., H] and this head makes logits from them a chunk at
    # a time (engine/lm_head.py); the roles read them through roles/common.response_logits.
    head: ChunkedHead | None = None
    # A mixture-of-experts model in training: its routers' load-balancing term on this micro-batch (engine/moe.py)
    router_balance: Tensor | None = None
    # Router replay's record of this pass: [b, T, L, k] experts per token and layer (engine/router_replay.py)
    routed_experts: Tensor | None = None

    def zero_loss(self) -> Tensor:
        """0 x every output: a loss with the gradient reductions of a real pass and no gradient."""
        zero = self.logits.sum() * 0.0
        return zero + self.head.zero_term() if self.head is not None else zero

    def at(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The outputs at padded `positions` [b, K] of each row: (values [M, ...], where [b, K] bool).

        `where` marks which positions have a value, in row-major order: all of them in the padded
        layout (padding included, as the model computed it), only the real tokens when packed."""
        rows = torch.arange(self.shape[0], device=positions.device)[:, None]
        if self.packing is None:
            where = torch.ones(positions.shape, dtype=torch.bool, device=positions.device)
            return self.logits[rows, positions].flatten(0, 1), where
        index = self.packing.packed_index()[rows, positions]
        where = index >= 0
        return self.logits.flatten(0, 1)[index[where]], where


def scatter_rows(values: Tensor, where: Tensor) -> Tensor:
    """`values` [M] back to [b, K] at `where` (what ModelOutput.at returned), 0 elsewhere."""
    return values.new_zeros(where.shape).masked_scatter(where, values)


@dataclass
class StepResult:
    """What one optimizer step did (identical on every rank)."""

    loss: float  # the global mini-batch's loss: contributions summed over micro-batches and ranks
    grad_norm: float  # global gradient norm before clipping (inf / nan when non-finite)
    lr: float  # learning rate used by this step
    skipped: bool  # the gradient was not finite: no update was made
    metrics: dict[str, list[float]] = field(default_factory=dict)  # loss_fn metrics, one per micro-batch


# an engine checkpoint's step counters (and scheduler), beside its shards
ENGINE_STATE_FILE = "engine_state.pt"


def save_engine_state(path: str | Path, state: dict[str, Any]) -> None:
    """An engine checkpoint's small state (step counters, scheduler) into its folder (one rank calls)."""
    torch.save(state, Path(path) / ENGINE_STATE_FILE)


def load_engine_state(path: str | Path) -> dict[str, Any]:
    """What `save_engine_state` wrote in `path`; a folder without it is no engine checkpoint (an error naming
    the folder, before any shard is read)."""
    file = Path(path) / ENGINE_STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{path} is not an engine checkpoint (no {ENGINE_STATE_FILE}); see save()")
    return torch.load(file, weights_only=True)


@dataclass(frozen=True)
class EngineSpec:
    """What builds a training engine (`build_engine(spec)`, or `FSDPEngine(spec)` / `MegatronEngine(spec)`):
    every engine's settings, and each strategy's own (`fsdp`, `megatron`; the other one is ignored).

    model_path: a local Hugging Face folder. head: "lm" (causal LM) or "value" (a 1-label token
    classifier; its `score` is initialised from `seed` when the folder has none).
    optim: None builds a frozen engine (reference model): forward only.
    grad_clip: the gradient norm clipped to (None: no clipping).
    total_training_steps: needed by cosine / linear decay and by warmup_ratio.
    activation_checkpointing: recompute each decoder layer in backward (same numbers, less memory).
    packing: run micro-batches as packed sequences (no padding computed).
    max_tokens_per_micro_batch: cut micro-batches by this token budget instead of `micro_batch_size`.
    router_aux_loss_coef: a mixture-of-experts model's load-balancing weight (None: its own; engine/moe.py).
    lora: low-rank adapters (rank > 0 or an adapter folder to start from; FSDP2, and megatron for the actor), every other weight frozen
    but a value model's head.
    freeze_vision_tower: a vision-language model's vision tower gets no gradient and no optimizer state (FSDP2; a
    text model: a warning).
    override_config: attributes set on the folder's Hugging Face config before the model is built (FSDP2 only;
    `models.config_overrides.apply_overrides`), kept in the exported config.json; `override_key` names that setting in errors.
    dist_checkpoint: megatron only: a megatron distributed checkpoint the weights start from instead of
    model_path's (which still gives the architecture; engine/megatron/dist_start.py); `dist_checkpoint_key`
    names that setting in errors.
    router_replay: a mixture-of-experts model's routers record their choices on request and replay the ones a
    batch carries (engine/router_replay.py; actor.router_replay).
    """

    model_path: str | Path
    head: Head
    device: torch.device | str
    optim: OptimConfig | None = None
    grad_clip: float | None = None
    total_training_steps: int | None = None
    strategy: Strategy = "fsdp"
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    activation_checkpointing: bool = False
    seed: int = 1
    packing: bool = False
    max_tokens_per_micro_batch: int | None = None
    router_aux_loss_coef: float | None = None
    lora: LoraConfig | None = None
    freeze_vision_tower: bool = False
    override_config: dict[str, Any] = field(default_factory=dict)
    override_key: str = "actor.override_config"
    dist_checkpoint: str | Path | None = None
    dist_checkpoint_key: str = "actor.megatron.dist_checkpoint"
    router_replay: bool = False


def strategy_param_dtype(
    strategy: Strategy, fsdp: FSDPConfig, megatron: MegatronConfig, device: torch.device
) -> torch.dtype:
    """The compute dtype an engine of `strategy` resolves its settings to on `device`: the one rule for the
    engines and for a rollout pool that computes as the actor does (megatron-core never probes the CPU:
    float32 there). The FSDP2 engine then makes its ranks agree on the CPU probe's answer."""
    if strategy == "megatron":
        return resolve_param_dtype(megatron.param_dtype, device, "megatron.param_dtype", cpu_probe=False)
    return resolve_param_dtype(fsdp.param_dtype, device)


def check_engine_args(engine: str, spec: EngineSpec) -> None:
    """What every engine's constructor checks first: a process group, and sane clipping / token budget."""
    grad_clip, max_tokens_per_micro_batch = spec.grad_clip, spec.max_tokens_per_micro_batch
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{engine} needs torch.distributed initialised first (the worker group does it: "
            "gloo on CPU, NCCL on GPU; a world of size 1 is fine)"
        )
    if grad_clip is not None and grad_clip <= 0:
        raise ValueError(f"grad_clip must be > 0 or None (no clipping), got {grad_clip}")
    if max_tokens_per_micro_batch is not None and max_tokens_per_micro_batch < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1 or None, got {max_tokens_per_micro_batch}")
    if spec.dist_checkpoint and engine != "MegatronEngine":
        raise ValueError(
            f"{spec.dist_checkpoint_key}: a megatron distributed checkpoint starts the megatron engine only; "
            "set actor.strategy=megatron, or start from a Hugging Face folder (`tandem convert mcore-to-hf`)"
        )


def pad_micro_batch(pad_id: int, device: torch.device | str = "cpu", tokens: int = 1) -> Batch:
    """A row of pad tokens: the cheapest pass that still runs every layer's collectives. (The FSDP2 engine
    asks for 2: a length of 1 would make its compiled layers compile again, for that size alone.)"""
    ids = torch.full((1, tokens), pad_id, dtype=torch.long, device=device)
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(tokens, device=device).view(1, tokens),
        }
    )


class TrainEngine(ABC):
    """One model (+ optimizer when trainable), sharded over the worker group's ranks."""

    dp_rank: int  # this rank's data-parallel index
    dp_size: int  # data-parallel ranks
    param_dtype: torch.dtype  # the forward / backward dtype (the rollout engine computes in it too)
    config: Any  # the model's Hugging Face config (a tensor-parallel rollout's cuts are read from it)
    device: torch.device  # where this rank computes
    _dp_group: Any = None  # the data-parallel process group (None: the default group)
    # fsdp.torch_compile's and fsdp.lm_head_compile's warm-ups, paid at start-up (None: no compile)
    compile_seconds: float | None = None
    _is_offloaded: bool = False  # set by offload(), cleared by onload()
    optimizer: Any = None  # None: a frozen engine (built with optim=None), forward only

    @abstractmethod
    def forward(
        self, batch: Batch, fn: ForwardFn, micro_batch_size: int, record_routing: bool = False
    ) -> Batch:
        """No-grad forward in micro-batches; `fn`'s per-row tensors concatenated, in order. Router replay
        (an engine built with `EngineSpec.router_replay`; engine/router_replay.py): `record_routing` adds each
        token's experts to the outputs as `routed_experts`; a batch that carries that column (here or in
        `train_step`) is routed to those experts."""

    @abstractmethod
    def train_step(self, batch: Batch, loss_fn: LossFn, micro_batch_size: int) -> StepResult:
        """Forward-backward over micro-batches, clip, optimizer step (skipped if non-finite)."""

    @abstractmethod
    def scheduler_step(self) -> float:
        """Advance the learning-rate schedule by one TRAINING step; returns the new lr."""

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses (0 for a frozen engine)."""
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else 0.0

    def all_reduce_sum(self, value: Tensor) -> Tensor:
        """Sum a tensor over the data-parallel ranks (global token / sequence counts)."""
        reduced = value.detach().to(self.device, copy=True)
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM, group=self._dp_group)
        return reduced.to(value.device)

    def _max_over_ranks(self, count: int) -> int:
        """The largest `count` over every rank of the default group (micro-batch counts every rank must run)."""
        value = torch.tensor(count, dtype=torch.int64, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value)

    @abstractmethod
    def state_dict_iter(self) -> Iterator[tuple[str, Tensor]]:
        """Full weights in Hugging Face names, one tensor at a time (every rank must iterate)."""

    @abstractmethod
    def state_dict_cuts(
        self, cuts_of: Callable[[str, tuple[int, ...]], list[Cut | None]]
    ) -> Iterator[tuple[str, Tensor, Cut | None, torch.Size]]:
        """(HF name, this rank's cut of the tensor, the cut, the whole tensor's shape), one tensor at a time, for
        a tensor-parallel rollout engine: `cuts_of(name, shape)` is every rank's cut (models/tp_cuts.py).
        Collective, like `state_dict_iter`."""

    def adapter_state(self) -> dict[str, Tensor]:
        """The LoRA adapters, full, under the names of a PEFT adapter file (collective)."""
        raise NotImplementedError(self._no_adapters("adapter_state"))

    def save_adapter(self, path: str | Path) -> int:
        """The LoRA adapters alone as a PEFT adapter folder in `path` (adapter_config.json,
        adapter_model.safetensors), written by every rank that calls (collective: every rank must call; give
        each rank its own folder). Returns the adapters' size in bytes."""
        raise NotImplementedError(self._no_adapters("save_adapter"))

    def without_adapter(self) -> TrainEngine:
        """This engine's model with its LoRA adapters off, as a frozen engine (forward only) over the same
        weights: the reference policy of a LoRA actor, no second copy of the base model."""
        raise NotImplementedError(self._no_adapters("without_adapter"))

    def _no_adapters(self, what: str) -> str:
        return (
            f"{what}: {type(self).__name__} trains no LoRA adapters (LoRA is built on the FSDP2 and megatron "
            "engines, with actor.lora.rank > 0)"
        )

    def vision_adapters(self) -> list[str]:
        """The LoRA layers inside a vision-language model's vision tower: none without LoRA adapters."""
        return []

    def expert_adapters(self) -> list[str]:
        """The LoRA layers on a mixture-of-experts model's fused expert tensors and routers: none without them."""
        return []

    @staticmethod
    def check_buildable(settings: Any, folders: dict[str, str]) -> list[str]:
        """What this engine could not build, read before any worker starts (`engine.check_buildable`): this
        install, and each model folder of `folders` (what to call it in a message -> the folder) under the
        engine's config section `settings`. One line per problem; [] when everything builds."""
        return []

    @abstractmethod
    def save(self, path: str | Path) -> None:
        """Sharded model + optimizer + scheduler checkpoint into folder `path` (every rank calls)."""

    @abstractmethod
    def load(self, path: str | Path, weights_only: bool = False) -> None:
        """Restore what `save` wrote (every rank calls); `weights_only`: the model's weights alone (an export
        needs no optimizer state, which may not reshard to its layout)."""

    @abstractmethod
    def export_hf(self, path: str | Path) -> None:
        """A Hugging Face folder (safetensors + config + tokenizer files) that transformers loads."""

    def dispatch_info(self) -> tuple[int, int, bool]:
        """(dp_rank, dp_size, collect) for Dispatch.MP: ranks of one data-parallel group get the same rows
        and the one with collect=True returns the output. Plain data parallel unless model-parallel."""
        return self.dp_rank, self.dp_size, True

    def on_device(self, train: bool = False) -> contextlib.AbstractContextManager[None]:
        """The state the calls inside need, on the device for all of them: the parameters, and with `train`
        gradients and optimizer state. An engine that keeps parts of its state in host memory between calls
        (megatron's *_offload switches) brings them in once here and moves them out when the outermost use ends;
        its own calls do the same when made outside one. (A role wraps an update of many optimizer steps in it.)"""
        return contextlib.nullcontext()

    def offload(self) -> None:  # noqa: B027 - nothing to move on CPU
        """Move parameters, gradients and optimizer state to host memory (GPU)."""

    def onload(self) -> None:  # noqa: B027
        """Undo `offload`."""

    def _check_onloaded(self, what: str) -> None:
        if self._is_offloaded:
            raise RuntimeError(f"{what} on an offloaded engine: call onload() first")

    def _check_trainable(self) -> None:
        """What every engine's `train_step` checks first: an optimizer, and the state onloaded."""
        if self.optimizer is None:
            raise RuntimeError(
                "train_step on a frozen engine (built with optim=None); give it an OptimConfig"
            )
        self._check_onloaded("train_step")
