"""`MegatronEngine`: a Hugging Face causal LM (Qwen2, Qwen3, Llama incl. Llama 3's scaled RoPE, Mixtral, Qwen3-MoE:
convert.py) as megatron-core's GPTModel, with tensor (TP) and pipeline (PP) parallelism, data parallel over the
rest of the ranks; optionally megatron's sequence parallel with TP (norms and residuals split along the sequence:
layers.py), virtual pipeline stages (`virtual_pipeline` model chunks per PP rank, the interleaved schedule), expert
parallel (experts.py) and context parallel (each sequence split over the CP ranks: context_parallel.py). The model's
construction: build.py; the pipeline schedule and each micro-batch's inputs: schedule.py; weights out: weights.py;
checkpoints: state.py; the state in host memory between calls: offload.py; the parallel state: parallel.py.

Layout. megatron's parallel state is built once per process from the default process group (world =
TP x PP x DP, TP ranks adjacent); every engine of the process (actor, reference, critic) shares it.
Ranks of one data-parallel group (same dp_rank) receive the same rows (`dispatch_info`, Dispatch.MP).

Construction. Every rank reads the Hugging Face folder on the CPU (float32, through transformers, so a
value head missing from a causal-LM folder gets the same seeded init as on FSDP) and copies its own cut
of each weight into the model it builds (convert.py). The critic / reward model replace the output layer
with a replicated 1-wide `ValueHead`.

Micro-batches run through megatron's pipeline schedule (`get_forward_backward_func`): one forward /
backward per micro-batch on every stage (every chunk), activations sent between stages; the interleaved
schedule gets micro-batches of one shape, in groups of PP (`PipelineSchedule.run`). Packing: each micro-batch's
sequences are packed into rows as on FSDP (data/packing.py), kept apart by a block-diagonal causal
attention mask (megatron's RoPE takes no position ids; RoPE scores depend only on the distance between
positions, so a sequence gives the same outputs wherever it sits in its row). The roles' functions run
on the last stage with vocabulary-parallel logits (vocab_parallel.py); their outputs and metrics are
broadcast to the other stages, so every rank returns the same.

Optimizer: megatron's (`get_megatron_optimizer`, AdamW, weight decay on every parameter as on FSDP);
the distributed optimizer (state sharded over data-parallel ranks) on GPU when
megatron.distributed_optimizer is on. Gradients are averaged over data-parallel ranks by megatron's DDP
(the loss is scaled by dp, as on FSDP); the gradient norm comes from megatron (each parameter counted
once over TP / PP); clipping and the non-finite skip are done here, as on FSDP.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.utils import clip_grads_with_norm_

from tandem.batch import Batch, Partition
from tandem.config.schema import MegatronConfig
from tandem.engine import hf_io, moe, router_replay
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
from tandem.engine.fsdp import lora as fsdp_lora
from tandem.engine.megatron import convert
from tandem.engine.megatron import lora as megatron_lora
from tandem.engine.megatron.build import build_model, build_optimizer
from tandem.engine.megatron.experts import RouterBalance, RouterTape, row_groups
from tandem.engine.megatron.offload import FORWARD, PARTS, TRAIN, StateOffload
from tandem.engine.megatron.parallel import megatron_available, parallel_layout
from tandem.engine.megatron.schedule import PipelineSchedule
from tandem.engine.megatron.state import Checkpoints
from tandem.engine.megatron.vocab_parallel import VocabParallel
from tandem.engine.megatron.weights import WeightsOut
from tandem.engine.micro import dummy_like, merge_outputs, real_token_count, split_micro_batches, to_cpu
from tandem.engine.optim import lr_multiplier
from tandem.models.tp_cuts import Cut

logger = logging.getLogger(__name__)


# megatron's keys for a layer split other than the even one (override_transformer_config)
UNEVEN_PIPELINE = (
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
)


class MegatronEngine(TrainEngine):
    """One Hugging Face model (+ megatron's optimizer when `optim` is given) on megatron-core.

    `spec` as FSDPEngine's (engine/base.py `EngineSpec`); `spec.megatron` holds the parallel sizes and
    precision. On the CPU the model runs in float32 over gloo (megatron adapted by cpu_adapter.py); on CUDA
    in `megatron.param_dtype`
    (bfloat16 by default) with float32 master weights in the optimizer.

    Its parts, built once over explicit arguments and held: the model (build.py's functions), the pipeline
    schedule (`PipelineSchedule`), the offload (`StateOffload`), weights out (`WeightsOut`) and checkpoints
    (`Checkpoints`); none reads the engine.
    """

    _routes: RouterTape | None = None  # router replay (spec.router_replay; experts.py)

    def __init__(self, spec: EngineSpec) -> None:
        check_engine_args("MegatronEngine", spec)
        # actor.lora: PEFT's adapters inside megatron's linears, every other weight frozen (lora.py)
        self.lora = spec.lora if fsdp_lora.enabled(spec.lora) else None
        if self.lora is not None and spec.head != "lm":
            raise ValueError(
                "critic.lora with actor.strategy=megatron: LoRA on megatron is built for the actor (a causal LM); "
                "train the critic whole (critic.lora.rank=0) or use actor.strategy=fsdp"
            )
        if self.lora is not None and self.lora.dropout > 0:
            raise ValueError(
                f"actor.lora.dropout={self.lora.dropout} with actor.strategy=megatron: dropout on the adapters is "
                "built on FSDP2 only; set it to 0 or use actor.strategy=fsdp"
            )
        megatron, head, optim, seed = spec.megatron, spec.head, spec.optim, spec.seed
        activation_checkpointing = spec.activation_checkpointing
        self.device = torch.device(spec.device)
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)
        from tandem.engine.megatron import cpu_adapter, without_te

        without_te.install()
        if self.device.type == "cpu":
            cpu_adapter.install()
        self._scope = cpu_adapter.CudaLiteralsOnCpu if self.device.type == "cpu" else contextlib.nullcontext
        self.model_path = str(spec.model_path)
        self.head = head
        self.packing = spec.packing
        self.max_tokens_per_micro_batch = spec.max_tokens_per_micro_batch
        self.grad_clip = spec.grad_clip
        self.global_step = 0
        self._schedule_step = 0
        self._is_offloaded = False

        if megatron.virtual_pipeline > 1 and megatron.pipeline_parallel == 1:
            raise ValueError(
                f"actor.megatron.virtual_pipeline={megatron.virtual_pipeline} needs actor.megatron.pipeline_parallel "
                "> 1 (model chunks interleave over the pipeline stages)"
            )
        self.layout = parallel_layout(
            megatron.tensor_parallel,
            megatron.pipeline_parallel,
            seed,
            megatron.virtual_pipeline,
            megatron.expert_parallel,
            megatron.context_parallel,
            megatron.sequence_parallel,
        )
        layout = self.layout
        # the engine face's data-parallel place (engine/base.py): read by the roles and dispatch
        self.dp_rank, self.dp_size, self._dp_group = layout.dp_rank, layout.dp_size, layout.dp_group
        self.vocab_parallel = (
            VocabParallel(layout.tp_group, layout.tp_rank, layout.tp_size)
            if layout.tp_size > 1 and head == "lm"
            else None
        )

        if spec.override_config:
            raise ValueError(
                f"{spec.override_key} is applied by the FSDP2 engine; megatron's own is "
                "actor.megatron.override_transformer_config"
            )
        config = hf_io.load_config(self.model_path, head)
        export_config = config.to_dict()  # the folder's, as export_hf writes it
        hf_io.disable_dropout(config)
        config.use_cache = False
        convert.check_supported(
            config,
            layout.tp_size,
            layout.pp_size,
            layout.ep_size,
            layout.sequence_parallel,
        )
        self.config = config
        if self.lora is not None:  # a mixture-of-experts model's routers take no adapter here (lora.py)
            self.lora = megatron_lora.megatron_targets(self.lora, config)
        shapes = convert.shapes_of(config)
        # megatron's uneven split (first / last stage sizes) is checked by its TransformerConfig; an even one here
        uneven = any(megatron.override_transformer_config.get(key) for key in UNEVEN_PIPELINE)
        if not uneven and config.num_hidden_layers % (layout.pp_size * layout.vp_size):
            raise ValueError(
                f"{self.model_path}: num_hidden_layers={config.num_hidden_layers} is not a multiple of "
                f"actor.megatron.pipeline_parallel x virtual_pipeline = {layout.pp_size * layout.vp_size}"
            )
        self.param_dtype = strategy_param_dtype("megatron", spec.fsdp, megatron, self.device)

        with self._scope():
            start = (str(spec.dist_checkpoint), spec.dist_checkpoint_key) if spec.dist_checkpoint else None
            built = build_model(
                layout,
                config,
                head,
                self.model_path,
                self.param_dtype,
                self.device,
                shapes,
                activation_checkpointing=activation_checkpointing,
                seed=seed,
                megatron=megatron,
                # actor.router_replay: megatron's routers built with their replay (experts.RouterTape drives it)
                router_replay=spec.router_replay,
                start=start,
                lora=self.lora,
            )
            self.chunks = built.chunks
            self._adapters = built.adapters  # each chunk's LoRA adapters (lora.py; [] without LoRA)
            self.optimizer = None
            # what the schedule runs: DDP-wrapped when trainable
            self.models: list[nn.Module] = list(self.chunks)
            if optim is not None:
                self.models, self.optimizer = build_optimizer(
                    self.chunks, optim, megatron, layout, self.param_dtype, self.device
                )
        switches = (megatron.param_offload, megatron.grad_offload, megatron.optimizer_offload)
        self._offload = StateOffload(
            self.device, self.models, self.chunks, self.optimizer, [p for p, on in zip(PARTS, switches) if on]
        )
        self._offload.offload(self._offload.switched)  # between calls from the start, as after every call
        # weights out (weights.py) and checkpoints (state.py): parts over what the build made
        self._weights = WeightsOut(
            layout,
            self.chunks,
            built.chunk_map,
            adapters=self._adapters,
            hf_config=config,
            shapes=shapes,
            hf_shapes=built.hf_shapes,
            hf_class=built.hf_class,
            export_config=export_config,
            model_path=self.model_path,
            param_dtype=self.param_dtype,
            device=self.device,
            on_device=self.on_device,
        )
        self._checkpoints = Checkpoints(
            self.chunks,
            self.optimizer,
            self._offload,
            scope=self._scope,
            on_device=self.on_device,
            check_onloaded=self._check_onloaded,
        )
        # A mixture-of-experts causal LM in training: Tandem's load-balancing term in its routers (experts.py)
        routing = moe.routing_of(config, spec.router_aux_loss_coef) if head == "lm" else None
        recompute = megatron.override_transformer_config.get("recompute_granularity")
        if spec.router_replay and (activation_checkpointing or recompute) and layout.pp_size > 1:
            # A recomputed layer's router would replay the experts of the micro-batch whose forward ran last.
            what = (
                "actor.activation_checkpointing"
                if activation_checkpointing
                else f"actor.megatron.override_transformer_config.recompute_granularity={recompute}"
            )
            raise ValueError(
                f"{self.model_path}: actor.router_replay with {what} and "
                f"actor.megatron.pipeline_parallel={layout.pp_size} is not built; turn one of them off"
            )
        self._routes = self._route_tape(routing, config) if spec.router_replay else None
        self._balance = (
            RouterBalance(
                self.chunks,
                routing,
                config.num_hidden_layers,
                row_groups(layout.tp_group, layout.sequence_parallel, layout.cp_group),
            )
            if routing is not None and optim is not None
            else None
        )
        # the pipeline schedule and each micro-batch's inputs (schedule.py), over what it names
        self._pipeline = PipelineSchedule(
            layout,
            self.models,
            self.device,
            pad_id=self._pad_id(),
            packing=self.packing,
            vocab_parallel=self.vocab_parallel,
            router_balance=self._balance,
            routes=self._routes,
            row_rotaries=built.row_rotaries,
            scope=self._scope,
            agree=self._max_over_ranks,
        )
        self._lr = lr_multiplier(optim, spec.total_training_steps) if optim is not None else None
        self._peak_lr = optim.lr if optim is not None else 0.0
        if optim is not None:
            self._set_lr()

    def _route_tape(self, routing: moe.Routing | None, config: Any) -> RouterTape:
        if routing is None:
            raise ValueError(
                f"actor.router_replay: {self.model_path} is not a mixture-of-experts language model (no routers "
                "to replay); set actor.router_replay=off"
            )
        return RouterTape(self.chunks, routing, config.num_hidden_layers)

    def _check_routes(self, wanted: bool) -> None:
        if wanted and self._routes is None:
            raise ValueError(
                f"a batch with {router_replay.ROUTED_EXPERTS} (or record_routing) on an engine built without "
                "router replay (EngineSpec.router_replay, actor.router_replay)"
            )

    @staticmethod
    def check_buildable(settings: MegatronConfig, folders: dict[str, str]) -> list[str]:
        """megatron-core installed, and what megatron cannot build from the models of `folders` under the parallel
        layout of `settings` (actor.megatron): architecture, sizes the layout does not divide, read from their
        config.json alone. (LoRA is refused by the config's checks: config/checks/values.py.)"""
        problems = []
        if not megatron_available():
            problems.append("actor.strategy=megatron needs megatron-core: pip install -e '.[megatron]'")

        def check(config: Any) -> None:
            convert.check_supported(
                config,
                settings.tensor_parallel,
                settings.pipeline_parallel,
                settings.expert_parallel,
                settings.sequence_parallel,
            )
            chunks = settings.pipeline_parallel * settings.virtual_pipeline
            if config.num_hidden_layers % chunks:
                raise ValueError(
                    f"num_hidden_layers={config.num_hidden_layers} is not a multiple of actor.megatron."
                    f"pipeline_parallel x virtual_pipeline = {chunks} (each model chunk holds the same number of "
                    "layers)"
                )

        return problems + hf_io.config_problems(folders, check)

    def dispatch_info(self) -> tuple[int, int, bool]:
        return (
            self.dp_rank,
            self.dp_size,
            self.layout.tp_rank == 0 and self.layout.cp_rank == 0 and self.layout.last_stage,
        )

    # ------------------------------------------------------------------ weights out (weights.py), checkpoints (state.py)
    def state_dict_iter(self) -> Iterator[tuple[str, Tensor]]:
        return self._weights.state_dict_iter()

    def state_dict_cuts(
        self, cuts_of: Callable[[str, tuple[int, ...]], list[Cut | None]]
    ) -> Iterator[tuple[str, Tensor, Cut | None, torch.Size]]:
        return self._weights.state_dict_cuts(cuts_of)

    def export_hf(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        self._weights.export_hf(path, dtype)

    def save(self, path: str | Path) -> None:
        self._checkpoints.save(path, self.global_step, self._schedule_step)

    def save_weights(self, path: str | Path) -> None:
        """The model's weights alone as a megatron distributed checkpoint (state.py `Checkpoints.save_weights`)."""
        self._checkpoints.save_weights(path)

    def load(self, path: str | Path, weights_only: bool = False) -> None:
        steps = self._checkpoints.load(path, weights_only)
        if steps is None:  # the weights alone: the step and the schedule stay this engine's
            return
        self.global_step, self._schedule_step = steps
        if self.optimizer is not None:
            self._set_lr()

    # ------------------------------------------------------------------ LoRA (lora.py)
    def adapter_state(self) -> dict[str, Tensor]:
        """actor.lora's adapters, whole, under the names of a PEFT adapter file, on every rank (collective)."""
        if self.lora is None:
            raise RuntimeError("adapter_state: this engine trains no LoRA adapters (actor.lora.rank=0)")
        with self.on_device():
            return megatron_lora.adapter_state(
                self._adapters,
                self.layout.tp_group,
                self.layout.tp_size,
                self.layout.pp_group,
                self.layout.pp_size,
                self.layout.ep_group,
                self.layout.ep_size,
            )

    def expert_adapters(self) -> list[str]:
        """The PEFT layers of the adapters on this rank's experts (lora.py `ExpertAdapters`)."""
        return megatron_lora.expert_adapters(self._adapters)

    def save_adapter(self, path: str | Path) -> int:
        """actor.lora's adapters as a PEFT adapter folder in `path`, written by every rank (collective; give each
        rank its own folder), as the FSDP2 engine writes it. Returns the adapters' size in bytes."""
        adapters = self.adapter_state()
        fsdp_lora.save_adapter(path, self.lora, adapters, self.model_path)
        return sum(t.numel() * t.element_size() for t in adapters.values())

    def without_adapter(self) -> TrainEngine:
        """This engine with its adapters off, frozen: a LoRA actor's reference policy over the same weights."""
        if self.lora is None:
            raise RuntimeError("without_adapter: this engine trains no LoRA adapters (actor.lora.rank=0)")
        return fsdp_lora.WithoutAdapter(self, off=lambda: megatron_lora.disabled(self._adapters))

    # ------------------------------------------------------------------ forward / train
    def forward(
        self, batch: Batch, fn: ForwardFn, micro_batch_size: int, record_routing: bool = False
    ) -> Batch:
        """`fn(output, micro)` per micro-batch under no_grad (on the last stage; its outputs are sent to the
        other stages); per-row tensors on the CPU in the input's row order, on every rank. `record_routing`:
        also each token's experts (engine/router_replay.py)."""
        self._check_onloaded("forward")
        self._check_routes(record_routing or router_replay.ROUTED_EXPERTS in batch)
        with self.on_device():
            return self._forward(batch, fn, micro_batch_size, record_routing)

    def _forward(
        self, batch: Batch, fn: ForwardFn, micro_batch_size: int, record_routing: bool = False
    ) -> Batch:
        micros, plan = self._micro_batches(batch, micro_batch_size)
        empty = not micros
        if empty:  # keys and widths of the outputs still come from one (dummy) pass, as on FSDP
            micros = [dummy_like(batch)]
        parts: list[dict[str, Tensor]] = []

        def on_output(output: ModelOutput, micro: Batch) -> Tensor:
            out = to_cpu(fn(output, micro))
            parts.append({k: v[:0] for k, v in out.items()} if empty else out)
            return output.logits.sum() * 0.0

        for chunk in self.chunks:
            chunk.eval()
        with torch.no_grad():
            routed = self._pipeline.run(micros, on_output, forward_only=True, record=record_routing)
        parts = self._from_last_stage(parts)
        if record_routing:
            parts = [
                {**part, router_replay.ROUTED_EXPERTS: (r[:0] if empty else r).cpu()}
                for part, r in zip(parts, routed, strict=True)
            ]
        return merge_outputs(parts, plan)

    def train_step(self, batch: Batch, loss_fn: LossFn, micro_batch_size: int) -> StepResult:
        self._check_trainable()
        self._check_routes(router_replay.ROUTED_EXPERTS in batch)
        with self.on_device(train=True):
            return self._train_step(batch, loss_fn, micro_batch_size)

    def _train_step(self, batch: Batch, loss_fn: LossFn, micro_batch_size: int) -> StepResult:
        micros, _ = self._micro_batches(batch, micro_batch_size)
        real = bool(micros)
        if not real:  # an empty shard still joins the gradient all-reduce and the optimizer step
            micros = [dummy_like(batch) if len(batch.keys()) else pad_micro_batch(self._pad_id())]
        losses: list[float] = []
        metrics: dict[str, list[Any]] = defaultdict(list)

        def on_output(output: ModelOutput, micro: Batch) -> Tensor:
            if not real:
                return output.logits.sum() * 0.0
            loss, micro_metrics = loss_fn(output, micro)
            losses.append(float(loss.detach()))
            for key, value in micro_metrics.items():
                metrics[key].append(float(value.detach()) if isinstance(value, Tensor) else float(value))
            # DDP averages gradients over data-parallel ranks; the loss contract sums contributions. (Under
            # context parallel it averages over data x context ranks, and megatron's schedule scales the loss
            # by the CP size for that: each rank of a CP group holds a share of its rows' gradient.)
            return loss * self.dp_size

        for chunk, model in zip(self.chunks, self.models, strict=True):
            chunk.train()
            model.zero_grad_buffer()
        self.optimizer.zero_grad()
        step_tokens = 1.0
        if self._balance is not None:
            local = torch.tensor(float(sum(real_token_count(m) for m in micros) if real else 0.0))
            step_tokens = max(float(self.all_reduce_sum(local)), 1.0)
        # (a rank with no rows runs a dummy row that adds nothing, the balance term included)
        self._pipeline.run(micros, on_output, forward_only=False, step_tokens=step_tokens, balance=real)
        losses, metrics = self._from_last_stage((losses, dict(metrics)))
        if self._balance is not None:  # each stage's layers' share of the term, summed over the stages
            balance = torch.tensor(self._balance.take_total(), dtype=torch.float64, device=self.device)
            if self.layout.pp_size > 1:
                dist.all_reduce(balance, group=self.layout.pp_group)
            metrics["router_aux_loss"] = [float(balance)]
            losses.append(self._balance.routing.coef * float(balance))
        loss_sum = torch.tensor(sum(losses), dtype=torch.float64, device=self.device)
        dist.all_reduce(loss_sum, group=self._dp_group)
        lr = self.lr
        with self._scope():
            self.optimizer.prepare_grads()
            grad_norm = float(self.optimizer.get_grad_norm())
            skipped = not math.isfinite(grad_norm)
            if skipped:
                logger.warning(
                    "step %d: gradient norm is %s; optimizer step skipped", self.global_step, grad_norm
                )
            else:
                self._clip(grad_norm)
                self.optimizer.step_with_ready_grads()
        self.optimizer.zero_grad()
        self.global_step += 1
        return StepResult(loss=float(loss_sum), grad_norm=grad_norm, lr=lr, skipped=skipped, metrics=metrics)

    def _clip(self, grad_norm: float) -> None:
        """Scale the gradients to grad_clip, as FSDPEngine does (torch's clip with the global norm)."""
        optimizers = getattr(self.optimizer, "chained_optimizers", [self.optimizer])  # MoE: dense + experts
        params = [p for o in optimizers for p in o.get_parameters() if p.grad is not None]
        if self.grad_clip is not None and params:
            clip_grads_with_norm_(params, self.grad_clip, torch.tensor(grad_norm))

    def _micro_batches(self, batch: Batch, micro_batch_size: int) -> tuple[list[Batch], Partition | None]:
        # No agreement over ranks: data-parallel ranks share no collective until the gradient all-reduce.
        return split_micro_batches(
            batch, micro_batch_size, max_tokens=self.max_tokens_per_micro_batch, packing=self.packing
        )

    def _from_last_stage(self, value: Any) -> Any:
        """`value` as the last pipeline stage has it, on every stage (pickled: small per-row outputs)."""
        if self.layout.pp_size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=self.layout.pp_ranks[-1], group=self.layout.pp_group)
        return box[0]

    def _pad_id(self) -> int:
        return self.config.pad_token_id if self.config.pad_token_id is not None else 0

    # ------------------------------------------------------------------ schedule (lr, all_reduce_sum: engine/base.py)
    def _set_lr(self) -> None:
        lr = self._peak_lr * self._lr(self._schedule_step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def scheduler_step(self) -> float:
        if self.optimizer is None:
            raise RuntimeError("scheduler_step on a frozen engine (built with optim=None)")
        self._schedule_step += 1
        self._set_lr()
        return self.lr

    # ------------------------------------------------------------------ memory (offload.py)
    def on_device(self, train: bool = False) -> contextlib.AbstractContextManager[None]:
        """The parameters (`train`: also gradients and optimizer state) on the device for the calls inside; the
        parts megatron.*_offload switches on go back to host memory when the outermost use ends."""
        self._check_onloaded("a call")
        return self._offload.on_device(TRAIN if train else FORWARD, writes=train)

    def offload(self) -> None:
        """Parameters, gradient buffers and optimizer state to host memory, whatever the switches (a no-op on a
        CPU device). forward / train_step refuse until `onload`."""
        if self._is_offloaded or not self._offload.moves:
            return
        self._offload.offload(PARTS)
        self._is_offloaded = True

    def onload(self) -> None:
        if not self._is_offloaded:
            return
        self._offload.onload(PARTS)
        self._offload.changed(PARTS)  # the caller holds the state now
        self._is_offloaded = False
