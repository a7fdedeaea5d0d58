"""`FSDPEngine`: a transformers model sharded with FSDP2 (`fully_shard`) over the default process group.

Data parallel over every rank of the default group (dp_rank = rank, dp_size = world size), or with
`fsdp.sequence_parallel = k` over world / k groups of k ranks that split each row (Ulysses,
engine/fsdp/ulysses.py): dp_rank = rank // k. Parameters are sharded over every rank either way.
Construction: rank 0 reads the Hugging Face folder into float32 CPU weights, the other ranks
build the same model on the meta device; every decoder layer and then the root are
`fully_shard`-ed and the full state dict is broadcast from rank 0 into the shards. Buffers
(which FSDP does not shard) are broadcast from rank 0 as well: that is what gives the ranks
that started on the meta device their rotary `inv_freq` (non-persistent, so in no state dict).
The construction, compile and start-up probes are functions of build.py over explicit arguments (the
engine's `BuildFacts`, its model call); weights out (weights.py `WeightsOut`), checkpoints and offload (state.py
`Checkpoints`, `HostOffload`) are parts the engine builds once over explicit arguments and delegates to.

Collectives. FSDP all-gathers parameters in every forward and reduce-scatters gradients in
every backward, so all ranks must run the same number of passes. `forward` / `train_step`
agree on the largest micro-batch count over the ranks and pad the others with dummy passes
(one pad token) whose outputs are discarded and whose loss is 0 x the logits.

Packing (`packing=True`): each micro-batch runs as packed rows (tandem/data/packing.py) and the
roles read the outputs through `ModelOutput.at`. Token budget (`max_tokens_per_micro_batch`):
micro-batches are cut by tokens (real tokens when packing, padded width otherwise) instead of by
samples; every rank cuts its share into the same number of them (the largest any rank needs).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.nn.utils import clip_grads_with_norm_, get_total_norm

from tandem.batch import Batch, Partition
from tandem.config.schema import FSDPConfig
from tandem.data.packing import pack_model_inputs
from tandem.engine import attention as packed_attention
from tandem.engine import hf_io, kernels, moe
from tandem.engine import router_replay as replay
from tandem.engine.base import (
    EngineSpec,
    ForwardFn,
    LossFn,
    ModelOutput,
    StepResult,
    TrainEngine,
    check_engine_args,
    pad_micro_batch,
    strategy_param_dtype,
)
from tandem.engine.fsdp.build import (
    BuildFacts,
    build_model,
    chunked_head_works,
    compile_layers,
    compile_layers_wanted,
    offload_policy,
    packing_works,
)
from tandem.engine.fsdp.lora import WithoutAdapter
from tandem.engine.fsdp.lora import enabled as lora_enabled
from tandem.engine.fsdp.state import Checkpoints, HostOffload
from tandem.engine.fsdp.ulysses import (
    check_heads,
    scale_grad,
    sequence_parallel_groups,
    sp_attention,
    sp_forward,
)
from tandem.engine.fsdp.vision import VisionTower
from tandem.engine.fsdp.weights import WeightsOut
from tandem.engine.lm_head import ChunkedHead, chunk_tokens, compile_head, hidden_states_out
from tandem.engine.micro import (
    dummy_like,
    explain_out_of_memory,
    merge_outputs,
    real_token_count,
    split_micro_batches,
    to_cpu,
)
from tandem.engine.optim import build_optimizer, build_scheduler
from tandem.models.config_overrides import apply_overrides
from tandem.models.model_type import is_vision_language
from tandem.models.tp_cuts import Cut

logger = logging.getLogger(__name__)


class FSDPEngine(TrainEngine):
    """One Hugging Face model (+ AdamW when `optim` is given) sharded with FSDP2.

    Master weights, gradients and optimizer state are float32; forward / backward run in the
    resolved `spec.fsdp.param_dtype`. `spec.optim=None` builds a frozen engine (reference model): forward
    only. `spec`: the model, head, optimizer and settings (engine/base.py `EngineSpec`).
    """

    _routes: replay.HFRouterReplay | None = None  # router replay's hooks (spec.router_replay)

    def __init__(self, spec: EngineSpec) -> None:
        check_engine_args("FSDPEngine", spec)
        fsdp, head, optim = spec.fsdp, spec.head, spec.optim
        # actor.lora / critic.lora with rank > 0 (or an adapter folder to start from): low-rank adapters trained,
        # every other weight frozen but a value model's head (engine/fsdp/lora.py)
        self.lora = spec.lora if lora_enabled(spec.lora) else None
        self.packing = spec.packing
        self.max_tokens_per_micro_batch = spec.max_tokens_per_micro_batch
        self.model_path = str(spec.model_path)
        self.head = head
        self.device = torch.device(spec.device)
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        # Ulysses sequence parallel (engine/fsdp/ulysses.py): None, or this rank's group of ranks splitting each row
        self.sp, self._dp_group = sequence_parallel_groups(fsdp, self.device, self.world_size)
        sp_size = self.sp.size if self.sp else 1
        self.dp_rank = self.rank // sp_size
        self.dp_size = self.world_size // sp_size
        self.grad_clip = spec.grad_clip
        self.global_step = 0  # optimizer steps taken (or skipped); for logs and checkpoints
        self.param_dtype = strategy_param_dtype("fsdp", fsdp, spec.megatron, self.device)
        if (
            fsdp.param_dtype == "auto"
            and self.device.type == "cpu"
            and self._max_over_ranks(int(self.param_dtype != torch.bfloat16))
        ):
            self.param_dtype = torch.float32  # a CPU probe's choice, made per rank: bf16 only if all chose it

        # fsdp.attn_implementation: the kernel, and whether packed rows go to it as one row with their bounds
        attention = packed_attention.resolve(fsdp.attn_implementation, self.device, self.param_dtype)
        if optim is not None:
            packed_attention.check_trainable(attention, self.device, "actor.fsdp.attn_implementation")
        kernels.check_liger(fsdp.liger, self.device)
        if self.sp is not None:
            attention = sp_attention(fsdp, attention)
        self.varlen = attention in packed_attention.VARLEN_KERNELS
        if self.rank == 0:
            logger.info(
                "attention: %s (actor.fsdp.attn_implementation=%s)", attention, fsdp.attn_implementation
            )
        config = hf_io.load_config(self.model_path, head, attention)
        apply_overrides(config, spec.override_config, spec.override_key)
        if self.sp is not None:
            check_heads(config, self.sp.size)
        export_config = config.to_dict()  # as the user wrote it (dropout included), for export_hf
        hf_io.disable_dropout(config)
        config.use_cache = False
        self.config = config
        # a vision-language config keeps the vocabulary size in its text part
        self.vocab_size = config.get_text_config().vocab_size
        # A mixture-of-experts causal LM: its routers' load-balancing loss joins every training pass (engine/moe.py)
        self.routing = moe.routing_of(config, spec.router_aux_loss_coef) if head == "lm" else None
        if self.routing is not None and self.sp is not None:
            raise ValueError(
                f"actor.fsdp.sequence_parallel={self.sp.size} with the mixture-of-experts model in "
                f"{self.model_path}: not built (its load-balancing loss needs every token of a sequence on one "
                "rank); use actor.fsdp.sequence_parallel=1"
            )
        vision_language = is_vision_language(config)
        if vision_language and (head != "lm" or self.sp is not None):
            raise ValueError(
                f"{self.model_path} is a vision-language model: built as the policy (head 'lm') without "
                "actor.fsdp.sequence_parallel only"
            )
        if spec.freeze_vision_tower and not vision_language and self.rank == 0:
            logger.warning(
                "actor.freeze_vision_tower=true: %s is a text model, no vision tower to freeze",
                self.model_path,
            )
        # what the build, the start-up probes and the weights out read of this engine (build.py)
        facts = BuildFacts(
            model_path=self.model_path,
            head=head,
            config=config,
            rank=self.rank,
            world_size=self.world_size,
            device=self.device,
            param_dtype=self.param_dtype,
            vocab_size=self.vocab_size,
        )
        offload = offload_policy(fsdp.cpu_offload, self.device)
        self.model, hf_class, state_keys = build_model(
            facts,
            fsdp,
            self.lora,
            offload,
            spec.activation_checkpointing,
            spec.seed,
            spec.freeze_vision_tower and vision_language,
        )
        # actor.router_replay: the routers' choices recorded / replayed through the batch (engine/router_replay.py)
        self._routes = self._route_hooks(config, vision_language) if spec.router_replay else None
        # image inputs, and the vision tower on every rank in every forward (engine/fsdp/vision.py)
        self._vision = VisionTower(self.model) if vision_language else None
        # weights out; the HF state_dict's names are what state_dict_iter yields
        self._weights = WeightsOut(
            self.model, facts, self.lora, set(state_keys), self._vision, hf_class, export_config
        )
        if self.packing:
            self.packing = packing_works(self.model, self._model_forward, facts, hf_class)
        # fsdp.lm_head_chunk_tokens: the LM head a chunk at a time from the hidden states (engine/lm_head.py)
        self.lm_head_chunk = (
            chunk_tokens(fsdp.lm_head_chunk_tokens, self.vocab_size, self.device) if head == "lm" else None
        )
        self.lm_head_compiled = False  # the probe below runs eager
        if self.lm_head_chunk is not None and not chunked_head_works(
            self.model, self._model_forward, facts, self.lm_head_chunk, hf_class
        ):
            self.lm_head_chunk = None
        # fsdp.lm_head_compile: each chunk's arithmetic compiled and warmed up now (engine/lm_head.py), or None
        head_seconds = (
            compile_head(
                fsdp.lm_head_compile, self.lm_head_chunk, self.vocab_size, self.param_dtype, self.device
            )
            if self.lm_head_chunk is not None
            else None
        )
        self.lm_head_compiled = head_seconds is not None

        self.optimizer = None
        self.scheduler = None
        if optim is not None:
            # the trained weights only: all of them, or the adapters under actor.lora; not a frozen vision tower
            self.optimizer = build_optimizer([p for p in self.model.parameters() if p.requires_grad], optim)
            self.scheduler = build_scheduler(self.optimizer, optim, spec.total_training_steps)
        self._checkpoints = Checkpoints(
            self.model, self.optimizer, self.scheduler, self.lora is not None, self.rank
        )
        self._host = HostOffload(self.model, self.optimizer, self.device, offload is not None)
        # start-up compiles (fsdp.torch_compile, fsdp.lm_head_compile), warmed up and timed here, not in a step
        layer_seconds = (
            compile_layers(
                fsdp.torch_compile,
                self.model,
                self._model_forward,
                facts,
                hf_class,
                self.optimizer is not None,
                self.packing and self.varlen,
            )
            if compile_layers_wanted(fsdp.torch_compile, self.device, fsdp.sequence_parallel)
            else None
        )
        compiles = [seconds for seconds in (layer_seconds, head_seconds) if seconds is not None]
        self.compile_seconds = sum(compiles) if compiles else None

    # ------------------------------------------------------------------ forward
    def forward(
        self, batch: Batch, fn: ForwardFn, micro_batch_size: int, record_routing: bool = False
    ) -> Batch:
        """`fn(output, micro)` per micro-batch under no_grad; its per-row tensors concatenated on the CPU.

        A rank with no rows still runs `fn` once on a dummy row (zeros in the batch's shapes) and
        returns 0 rows of its outputs, so an empty shard has the same keys as the others. When
        every rank is empty, the result is an empty Batch with no keys. `record_routing`: the outputs also
        hold each token's experts (engine/router_replay.py)."""
        self._check_onloaded("forward")
        self._check_routes(record_routing or replay.ROUTED_EXPERTS in batch)
        micros, plan = self._micro_batches(batch, micro_batch_size)
        num_passes = self._max_over_ranks(len(micros))
        self.model.eval()
        parts: list[dict[str, Tensor]] = []
        with torch.no_grad():
            for i in range(num_passes):
                if i < len(micros):
                    micro = micros[i].to(self.device)
                    with explain_out_of_memory(
                        "forward", self.global_step, micro, i, len(micros), self.max_tokens_per_micro_batch
                    ):
                        parts.append(to_cpu(self._outputs(fn, micro, record_routing)))
                elif not micros and i == 0:
                    # An empty shard: run fn on a dummy row of the batch's shapes, keep 0 rows of it.
                    micro = dummy_like(batch).to(self.device)
                    parts.append(
                        {k: v[:0] for k, v in to_cpu(self._outputs(fn, micro, record_routing)).items()}
                    )
                else:
                    self._model_forward(pad_micro_batch(self._pad_id(), self.device, tokens=2))
        # FSDP2 keeps the root's parameters unsharded after a forward until the next backward: register the
        # sharded ones again, or a save (or an optimizer built now) would see other tensors than the optimizer's.
        self.model.reshard()
        if self._routes is not None:
            self._routes.end()
        return merge_outputs(parts, plan)

    # ------------------------------------------------------------------ training
    def train_step(self, batch: Batch, loss_fn: LossFn, micro_batch_size: int) -> StepResult:
        self._check_trainable()
        self._check_routes(replay.ROUTED_EXPERTS in batch)
        micros, _ = self._micro_batches(batch, micro_batch_size)
        num_passes = self._max_over_ranks(len(micros))
        self.model.train()  # dropout is 0; train mode switches on activation checkpointing
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        metrics: dict[str, list[Any]] = defaultdict(list)
        step_tokens = self._step_tokens(micros) if self.routing is not None else None
        for i in range(num_passes):
            if i < len(micros):
                micro = micros[i].to(self.device)
                with explain_out_of_memory(
                    "update", self.global_step, micro, i, len(micros), self.max_tokens_per_micro_batch
                ):
                    output = self._model_forward(micro, router=self.routing is not None)
                    loss, micro_metrics = loss_fn(output, micro)
                    if (
                        output.router_balance is not None
                    ):  # this micro-batch's token share of the balance term
                        balance = output.router_balance * (real_token_count(micro) / step_tokens)
                        loss = loss + self.routing.coef * balance
                        micro_metrics = {**micro_metrics, "router_aux_loss": balance.detach()}
                    if output.head is not None:  # the head's gradient reduction on every rank, rows or none
                        loss = loss + output.head.zero_term()
                    # FSDP averages gradients over all ranks; the loss contract sums contributions (over the
                    # data-parallel shares; the ranks of a sequence-parallel group each hold their tokens' share).
                    (loss * self.world_size).backward()
                loss_sum += loss.detach().double()
                for key, value in micro_metrics.items():
                    metrics[key].append(value.detach() if isinstance(value, Tensor) else value)
            else:
                # Same collectives as a real pass, no gradient.
                self._model_forward(
                    pad_micro_batch(self._pad_id(), self.device, tokens=2)
                ).zero_loss().backward()

        if self._routes is not None:
            self._routes.end()
        dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM, group=self._dp_group)
        grad_norm = self._clip_gradients()
        lr = float(self.optimizer.param_groups[0]["lr"])
        skipped = not math.isfinite(grad_norm)
        if skipped:
            logger.warning(
                "step %d: gradient norm is %s; optimizer step skipped, no update made",
                self.global_step,
                grad_norm,
            )
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # frees the gradients until the next step
        self.global_step += 1
        return StepResult(
            loss=float(loss_sum),
            grad_norm=grad_norm,
            lr=lr,
            skipped=skipped,
            metrics={key: [float(v) for v in values] for key, values in metrics.items()},
        )

    def _clip_gradients(self) -> float:
        """The global L2 norm of the gradient (all shards); clip to grad_clip when finite."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return 0.0
        total = get_total_norm([p.grad for p in params], norm_type=2.0)
        if isinstance(total, DTensor):
            # Partial over ranks: full_tensor() sums the shards' squares. Reduce on the compute device
            # (CPU-offloaded gradients would otherwise need a CPU collective under NCCL).
            total = total.to(self.device).full_tensor()
        norm = float(total)
        if self.grad_clip is not None and math.isfinite(norm):
            clip_grads_with_norm_(params, self.grad_clip, total)
        return norm

    def scheduler_step(self) -> float:
        if self.scheduler is None:
            raise RuntimeError("scheduler_step on a frozen engine (built with optim=None)")
        self.scheduler.step()
        return float(self.optimizer.param_groups[0]["lr"])

    # ------------------------------------------------------------------ weights out (weights.py's WeightsOut)
    def state_dict_iter(self) -> Iterator[tuple[str, Tensor]]:
        return self._weights.state_dict_iter()

    def state_dict_cuts(
        self, cuts_of: Callable[[str, tuple[int, ...]], list[Cut | None]]
    ) -> Iterator[tuple[str, Tensor, Cut | None, torch.Size]]:
        return self._weights.state_dict_cuts(cuts_of)

    def adapter_state(self) -> dict[str, Tensor]:
        return self._weights.adapter_state()

    def save_adapter(self, path: str | Path) -> int:
        return self._weights.save_adapter(path)

    def vision_adapters(self) -> list[str]:
        return self._weights.vision_adapters()

    def expert_adapters(self) -> list[str]:
        return self._weights.expert_adapters()

    def export_hf(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        self._weights.export_hf(path, dtype)

    # ------------------------------------------------------------------ checkpoints, offload (state.py's parts)
    def save(self, path: str | Path) -> None:
        self._checkpoints.save(path, self.global_step)

    def load(self, path: str | Path, weights_only: bool = False) -> None:
        step = self._checkpoints.load(path, weights_only)
        if step is not None:  # the weights alone leave the step and the schedule this engine's
            self.global_step = step

    def offload(self) -> None:
        self._host.offload()

    def onload(self) -> None:
        self._host.onload()

    @property
    def _is_offloaded(self) -> bool:  # what base.py's _check_onloaded reads
        return self._host.offloaded

    # ------------------------------------------------------------------ pre-flight, LoRA's reference policy
    @staticmethod
    def check_buildable(settings: FSDPConfig, folders: dict[str, str]) -> list[str]:
        """The models of `folders` this engine cannot load (hf_io.unloadable_folders: no transformers class of
        their kind for the role's head, or code of their own) and, with actor.fsdp.sequence_parallel (`settings`),
        those whose attention heads it does not split (engine/fsdp/ulysses.py); read from config.json alone."""
        problems = hf_io.unloadable_folders(folders)
        if settings.sequence_parallel > 1:
            problems += hf_io.config_problems(
                folders, lambda config: check_heads(config, settings.sequence_parallel)
            )
        return problems

    def without_adapter(self) -> TrainEngine:
        """This engine with its LoRA adapters off, frozen: a LoRA actor's reference policy (engine/fsdp/lora.py)."""
        if self.lora is None:
            raise RuntimeError("without_adapter: this engine trains no LoRA adapters (actor.lora.rank=0)")
        return WithoutAdapter(self)

    # ------------------------------------------------------------------ collectives (all_reduce_sum: base.py)
    def dispatch_info(self) -> tuple[int, int, bool]:
        """The ranks of a sequence-parallel group share one data-parallel index; its first answers."""
        return self.dp_rank, self.dp_size, self.sp is None or self.sp.rank == 0

    def _step_tokens(self, micros: list[Batch]) -> float:
        """Real tokens of this step's micro-batches on all data-parallel ranks (at least 1)."""
        local = torch.tensor(float(sum(real_token_count(m) for m in micros)), dtype=torch.float64)
        return max(float(self.all_reduce_sum(local)), 1.0)

    # ------------------------------------------------------------------ micro-batches and model calls
    def _micro_batches(self, batch: Batch, micro_batch_size: int) -> tuple[list[Batch], Partition | None]:
        """This rank's micro-batches (as many as on the rank that needs the most) and their row-order plan."""
        return split_micro_batches(
            batch,
            micro_batch_size,
            max_tokens=self.max_tokens_per_micro_batch,
            packing=self.packing,
            agree=self._max_over_ranks,
        )

    def _outputs(self, fn: ForwardFn, micro: Batch, record_routing: bool) -> dict[str, Tensor]:
        output = self._model_forward(micro, record_routing=record_routing)
        out = fn(output, micro)
        return {**out, replay.ROUTED_EXPERTS: output.routed_experts} if record_routing else out

    def _route_hooks(self, config: Any, vision_language: bool) -> replay.HFRouterReplay:
        if self.routing is None or vision_language:
            raise ValueError(
                f"actor.router_replay: {self.model_path} is not a mixture-of-experts language model (no routers "
                "to replay); set actor.router_replay=off"
            )
        return replay.HFRouterReplay(
            self.model,
            config.num_hidden_layers,
            self.routing.top_k,
            self.routing.num_experts,
            self.model_path,
        )

    def _check_routes(self, wanted: bool) -> None:
        if wanted and self._routes is None:
            raise ValueError(
                f"a batch with {replay.ROUTED_EXPERTS} (or record_routing) on an engine built without "
                "router replay (EngineSpec.router_replay, actor.router_replay)"
            )

    def _model_forward(
        self,
        micro: Batch,
        packed: bool | None = None,
        chunk: int | None = -1,
        router: bool = False,
        record_routing: bool = False,
    ) -> ModelOutput:
        """The model on one micro-batch, packed (default: as the engine is set) or padded; its logits, or with
        a head chunk (default: as the engine is set) its last hidden states and the head that makes logits.
        `router`: also the routers' load-balancing term of a mixture-of-experts model (engine/moe.py). With
        router replay: a micro-batch with `routed_experts` is routed to them; `record_routing` records."""
        ids = micro["input_ids"]
        chunk = self.lm_head_chunk if chunk == -1 else chunk
        packing = None
        pack = (self.packing if packed is None else packed) and "attention_mask" in micro
        if self._vision is not None:
            inputs, packing = self._vision.model_inputs(micro, self.device, self._pad_id() if pack else None)
        elif pack:
            # No attention mask: transformers separates the sequences by their restarting position ids; a
            # varlen kernel takes all of them as one row and their bounds (engine/attention.py).
            inputs, packing = pack_model_inputs(
                ids, micro["attention_mask"], self._pad_id(), one_row=self.varlen
            )
            if self.varlen:
                inputs.update(packed_attention.varlen_kwargs(inputs["position_ids"]))
        else:
            inputs = {
                key: micro[key] for key in ("input_ids", "attention_mask", "position_ids") if key in micro
            }
        routers: list[Tensor] | None = [] if router else None
        run = (
            partial(self._model, routers=routers)
            if self.sp is None
            else partial(sp_forward, self.model, sp=self.sp, pad_id=self._pad_id())
        )
        balance = None
        grid = tuple(inputs["input_ids"].shape)
        if self._routes is not None:  # set for every call: a recomputing backward replays it too
            self._routes.begin(self._route_target(micro, packing, grid), record_routing)
        if chunk is None:
            logits = run(inputs)
        else:
            with hidden_states_out(self.model) as out_embedding:
                logits = run(inputs)
        routed = None
        if record_routing:
            taken = self._routes.take(grid[0] * grid[1], self.device)
            real = micro.get("attention_mask") if "attention_mask" in micro else None
            routed = replay.from_grid(taken.view(*grid, *taken.shape[1:]), packing, tuple(ids.shape), real)
        if routers is not None:
            tokens = moe.real_tokens(inputs.get("attention_mask"), tuple(inputs["input_ids"].shape), packing)
            balance = moe.balance_loss(routers, tokens.to(self.device), self.routing)
        if chunk is None:
            return ModelOutput(
                logits, tuple(ids.shape), packing, router_balance=balance, routed_experts=routed
            )
        # FSDP2 leaves the root's parameters (the head's among them) unsharded after a forward.
        weight, bias = out_embedding.weight, out_embedding.bias
        if self.sp is not None:  # every rank of the group applies the head to all tokens: count it once
            weight, bias = scale_grad(weight, 1 / self.sp.size), scale_grad(bias, 1 / self.sp.size)
        head = ChunkedHead(weight, bias, chunk, self.lm_head_compiled)
        return ModelOutput(
            logits, tuple(ids.shape), packing, head=head, router_balance=balance, routed_experts=routed
        )

    def _route_target(self, micro: Batch, packing: Any, grid: tuple[int, int]) -> Tensor | None:
        """The micro-batch's `routed_experts` in the routers' row order (the flattened input grid), or None."""
        if replay.ROUTED_EXPERTS not in micro:
            return None
        placed = replay.to_grid(micro[replay.ROUTED_EXPERTS].to(self.device), packing, grid)
        return placed.reshape(grid[0] * grid[1], *placed.shape[2:])

    def _model(self, inputs: dict[str, Tensor], routers: list[Tensor] | None = None) -> Tensor:
        """The model's logits; with `routers`, its router logits (one [tokens, E] per MoE layer) appended there."""
        if routers is None:
            return self.model(**inputs, use_cache=False).logits
        output = self.model(**inputs, use_cache=False, output_router_logits=True)
        routers.extend(output.router_logits)
        return output.logits

    def _pad_id(self) -> int:
        # a vision-language config keeps it in its text part
        pad = getattr(self.config.get_text_config(), "pad_token_id", None)
        return pad if pad is not None else 0
