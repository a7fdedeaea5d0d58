"""`MegatronEngine`: a Hugging Face causal LM (Qwen2 / Llama family, Mixtral) as megatron-core's GPTModel, with
tensor (TP) and pipeline (PP) parallelism, data parallel over the rest of the ranks; optionally megatron's
sequence parallel with TP (norms and residuals split along the sequence: layers.py), virtual pipeline
stages (`virtual_pipeline` model chunks per PP rank, the interleaved schedule), expert parallel (experts.py)
and context parallel (each sequence split over the CP ranks: context_parallel.py). Checkpoints and offload:
state.py; the parallel state: parallel.py.

Layout. megatron's parallel state is built once per process from the default process group (world =
TP x PP x DP, TP ranks adjacent); every engine of the process (actor, reference, critic) shares it.
Ranks of one data-parallel group (same dp_rank) receive the same rows (`dispatch_info`, Dispatch.MP).

Construction. Every rank reads the Hugging Face folder on the CPU (float32, through transformers, so a
value head missing from a causal-LM folder gets the same seeded init as on FSDP) and copies its own cut
of each weight into the model it builds (convert.py). The critic / reward model replace the output layer
with a replicated 1-wide `ValueHead`.

Micro-batches run through megatron's pipeline schedule (`get_forward_backward_func`): one forward /
backward per micro-batch on every stage (every chunk), activations sent between stages; the interleaved
schedule gets micro-batches of one shape, in groups of PP (`_schedule`). Packing: each micro-batch's
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
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import clip_grads_with_norm_

from tandem.batch import Batch, Partition
from tandem.config.schema import MegatronConfig, OptimConfig
from tandem.data.packing import pack_model_inputs
from tandem.engine import hf_io, moe
from tandem.engine.base import (
    ForwardFn,
    Head,
    LossFn,
    ModelOutput,
    StepResult,
    TrainEngine,
    check_engine_args,
    pad_micro_batch,
    resolve_param_dtype,
)
from tandem.engine.megatron import convert
from tandem.engine.megatron.experts import RouterBalance, router_rows, stack_experts
from tandem.engine.megatron.layers import ValueHead, layer_spec
from tandem.engine.megatron.parallel import init_parallel_state
from tandem.engine.megatron.state import CheckpointAndOffload
from tandem.engine.megatron.vocab_parallel import VocabParallel
from tandem.engine.micro import dummy_like, merge_outputs, real_token_count, split_micro_batches, to_cpu
from tandem.engine.optim import lr_multiplier
from tandem.models.tp_cuts import Cut

logger = logging.getLogger(__name__)


class MegatronEngine(CheckpointAndOffload, TrainEngine):
    """One Hugging Face model (+ megatron's optimizer when `optim` is given) on megatron-core.

    Arguments as FSDPEngine's; `megatron` holds the parallel sizes and precision. On the CPU the model
    runs in float32 over gloo (megatron adapted by cpu_adapter.py); on CUDA in `megatron.param_dtype`
    (bfloat16 by default) with float32 master weights in the optimizer.
    """

    def __init__(
        self,
        *,
        model_path: str | Path,
        head: Head,
        device: torch.device | str,
        optim: OptimConfig | None,
        megatron: MegatronConfig,
        grad_clip: float | None,
        total_training_steps: int | None,
        activation_checkpointing: bool = False,
        seed: int = 1,
        packing: bool = False,
        max_tokens_per_micro_batch: int | None = None,
        router_aux_loss_coef: float | None = None,
        lora: Any = None,
    ) -> None:
        if lora is not None and lora.rank > 0:
            raise ValueError(
                f"actor.lora.rank={lora.rank}: LoRA is built on FSDP2 only; use actor.strategy=fsdp"
            )
        check_engine_args("MegatronEngine", grad_clip, max_tokens_per_micro_batch)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)
        from tandem.engine.megatron import cpu_adapter, without_te

        without_te.install()
        if self.device.type == "cpu":
            cpu_adapter.install()
        self._scope = cpu_adapter.CudaLiteralsOnCpu if self.device.type == "cpu" else contextlib.nullcontext
        self.model_path = str(model_path)
        self.head = head
        self.packing = packing
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.grad_clip = grad_clip
        self.global_step = 0
        self._schedule_step = 0
        self._is_offloaded = False
        self._cpu_copies: list[tuple[Tensor, Tensor]] = []

        from megatron.core import parallel_state as ps

        self.vp_size = megatron.virtual_pipeline
        if self.vp_size > 1 and megatron.pipeline_parallel == 1:
            raise ValueError(
                f"actor.megatron.virtual_pipeline={self.vp_size} needs actor.megatron.pipeline_parallel > 1 (model "
                "chunks interleave over the pipeline stages)"
            )
        init_parallel_state(
            megatron.tensor_parallel,
            megatron.pipeline_parallel,
            seed,
            self.vp_size,
            megatron.expert_parallel,
            megatron.context_parallel,
        )
        self.tp_rank, self.tp_size = ps.get_tensor_model_parallel_rank(), megatron.tensor_parallel
        self.sequence_parallel = megatron.sequence_parallel and self.tp_size > 1
        self.pp_rank, self.pp_size = ps.get_pipeline_model_parallel_rank(), megatron.pipeline_parallel
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        # context parallel: the ranks of a CP group hold the same rows, each a share of every row's columns
        self.cp_rank, self.cp_size = ps.get_context_parallel_rank(), megatron.context_parallel
        self._cp_group = ps.get_context_parallel_group() if self.cp_size > 1 else None
        self.last_stage = self.pp_rank == self.pp_size - 1
        self._tp_group = ps.get_tensor_model_parallel_group()
        self._pp_group = ps.get_pipeline_model_parallel_group()
        self._dp_group = ps.get_data_parallel_group()
        self._pp_ranks = dist.get_process_group_ranks(self._pp_group)  # global ranks, stage order
        self.ep_rank, self.ep_size = ps.get_expert_model_parallel_rank(), megatron.expert_parallel
        self._ep_group = ps.get_expert_model_parallel_group() if self.ep_size > 1 else None
        self.vocab_parallel = (
            VocabParallel(self._tp_group, self.tp_rank, self.tp_size)
            if self.tp_size > 1 and head == "lm"
            else None
        )

        config = hf_io.load_config(self.model_path, head)
        self._export_config = config.to_dict()
        hf_io.disable_dropout(config)
        config.use_cache = False
        convert.check_supported(
            config,
            self.tp_size,
            self.pp_size,
            self.ep_size,
            megatron.sequence_parallel and self.tp_size > 1,
            self.cp_size,
        )
        self.config = config
        self.shapes = convert.shapes_of(config)
        if config.num_hidden_layers % (self.pp_size * self.vp_size):
            raise ValueError(
                f"{self.model_path}: num_hidden_layers={config.num_hidden_layers} is not a multiple of "
                f"actor.megatron.pipeline_parallel x virtual_pipeline = {self.pp_size * self.vp_size}"
            )
        # layers of one model chunk: a pipeline rank holds vp_size chunks (virtual stages), interleaved
        self.layers_per_chunk = config.num_hidden_layers // (self.pp_size * self.vp_size)
        self.param_dtype = resolve_param_dtype(
            megatron.param_dtype, self.device, "megatron.param_dtype", cpu_probe=False
        )

        self._row_rotaries: list[nn.Module] = []  # context parallel: each chunk's RowRotary
        with self._scope():
            self.chunks, self._hf_class, self._hf_shapes = self._build(activation_checkpointing, seed)
            self.optimizer = None
            self.models: list[nn.Module] = list(
                self.chunks
            )  # what the schedule runs: DDP-wrapped when trainable
            if optim is not None:
                self._build_optimizer(optim, megatron.distributed_optimizer)
        # A mixture-of-experts causal LM in training: Tandem's load-balancing term in its routers (experts.py)
        routing = moe.routing_of(config, router_aux_loss_coef) if head == "lm" else None
        if routing is not None and activation_checkpointing and self.pp_size > 1:
            # Recomputed layers would run their routers' hooks during another micro-batch's turn.
            raise ValueError(
                f"{self.model_path}: a mixture-of-experts model with actor.activation_checkpointing and "
                f"actor.megatron.pipeline_parallel={self.pp_size} is not built; turn one of them off"
            )
        self._balance = (
            RouterBalance(
                self.chunks, routing, config.num_hidden_layers, self._tp_group, self.sequence_parallel
            )
            if routing is not None and optim is not None
            else None
        )
        self._lr = lr_multiplier(optim, total_training_steps) if optim is not None else None
        self._peak_lr = optim.lr if optim is not None else 0.0
        if optim is not None:
            self._set_lr()

    # ------------------------------------------------------------------ construction
    def _transformer_config(self, activation_checkpointing: bool) -> Any:
        from megatron.core.transformer import TransformerConfig

        extra: dict[str, Any] = {}
        if activation_checkpointing:
            extra = {
                "recompute_granularity": "full",
                "recompute_method": "uniform",
                "recompute_num_layers": 1,
            }
        return TransformerConfig(
            **convert.transformer_config_kwargs(self.config),
            **convert.moe_config_kwargs(self.config, self.ep_size),
            tensor_model_parallel_size=self.tp_size,
            pipeline_model_parallel_size=self.pp_size,
            virtual_pipeline_model_parallel_size=self.vp_size if self.vp_size > 1 else None,
            sequence_parallel=self.sequence_parallel,
            context_parallel_size=self.cp_size,
            params_dtype=self.param_dtype,
            pipeline_dtype=self.param_dtype,
            bf16=self.param_dtype == torch.bfloat16,
            fp16=self.param_dtype == torch.float16,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            use_cpu_initialization=True,
            # Overwritten from the folder next, but megatron's CPU initialisation is also what marks weights as
            # tensor-parallel: without it the gradient norm counts rank 0's shards only.
            perform_initialization=True,
            # micro-batches differ in shape (token budget, packing); the interleaved schedule pads them to one
            variable_seq_lengths=self.vp_size == 1,
            moe_token_dispatcher_type="alltoall",  # megatron asks for it with variable_seq_lengths
            # The fused kernels are CUDA-only or need Apex / Transformer Engine; the torch paths compute the same.
            masked_softmax_fusion=False,
            bias_activation_fusion=False,
            bias_dropout_fusion=False,
            apply_rope_fusion=False,
            gradient_accumulation_fusion=False,
            persist_layer_norm=False,
            **extra,
        )

    def _build(
        self, activation_checkpointing: bool, seed: int
    ) -> tuple[list[nn.Module], type, dict[str, tuple]]:
        """This rank's model chunks (one per virtual stage; one without virtual_pipeline), each filled with its
        cut of the folder's weights."""
        from megatron.core.models.gpt import GPTModel

        tied = self.head == "lm" and bool(getattr(self.config, "tie_word_embeddings", False))
        config = self._transformer_config(activation_checkpointing)  # one object: the schedule reads it
        hf_model = hf_io.load_pretrained(self.model_path, self.config, self.head, seed)
        hf_state = hf_model.state_dict()
        hf_shapes = {name: tuple(t.shape) for name, t in hf_state.items()}
        chunks = []
        for chunk in range(self.vp_size):
            first, last = self._chunk_ends(self.pp_rank, chunk)
            model = GPTModel(
                config,
                layer_spec(
                    self.sequence_parallel,
                    self.layers_per_chunk,
                    convert.num_experts(self.config),
                    context_parallel=self.cp_size > 1,
                ),
                vocab_size=self.config.vocab_size,
                max_sequence_length=self.config.max_position_embeddings,
                pre_process=first,
                post_process=last,
                share_embeddings_and_output_weights=tied,
                position_embedding_type="rope",
                rotary_base=convert.rotary_base(self.config),
                **({"vp_stage": chunk} if self.vp_size > 1 else {}),
            )
            if self.head == "value" and last:
                model.output_layer = ValueHead(
                    self.config.hidden_size, self.param_dtype, self.sequence_parallel
                )
            if self.cp_size > 1:  # rotary positions of each row's own columns (context_parallel.py)
                from tandem.engine.megatron.context_parallel import RowRotary

                model.rotary_pos_emb = RowRotary(model.rotary_pos_emb)
                self._row_rotaries.append(model.rotary_pos_emb)
            self._fill(model, self._slots(self.pp_rank, chunk), hf_state)
            # megatron builds its torch norms in float32 whatever params_dtype says (its own training loop
            # casts the whole model, Float16Module); buffers keep their dtype
            for param in model.parameters():
                param.data = param.data.to(self.param_dtype)
            model.to(self.device)
            chunks.append(model)
        hf_class = type(hf_model)
        del hf_model, hf_state
        return chunks, hf_class, hf_shapes

    def _fill(self, model: nn.Module, slots: list[convert.Slot], hf_state: dict[str, Tensor]) -> None:
        filled = set()
        for slot in slots:
            param = model.get_parameter(slot.megatron)
            tp_rank, tp_size = (0, 1) if slot.expert is not None else (self.tp_rank, self.tp_size)
            shard = convert.to_shard(slot, [hf_state[n] for n in slot.hf], self.shapes, tp_rank, tp_size)
            if tuple(shard.shape) != tuple(param.shape):
                raise ValueError(
                    f"{self.model_path}: {slot.hf} give {slot.megatron} the shape {tuple(shard.shape)}, megatron "
                    f"built {tuple(param.shape)}"
                )
            with torch.no_grad():
                param.copy_(shard)
            filled.add(slot.megatron)
        unfilled = [name for name, _ in model.named_parameters() if name not in filled]
        if unfilled:
            raise ValueError(
                f"megatron parameters with no Hugging Face source (converter incomplete): {unfilled[:5]}"
            )

    def _build_optimizer(self, optim: OptimConfig, distributed: bool) -> None:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        # megatron's distributed optimizer takes CUDA tensors only (it checks their type names).
        distributed = distributed and self.device.type == "cuda"
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=distributed
        )
        # One DDP per chunk; only the first buckets its gradients (as megatron's own training loop does).
        self.models = [
            DistributedDataParallel(chunk.config, ddp_config, chunk, disable_bucketing=i > 0)
            for i, chunk in enumerate(self.chunks)
        ]
        config = self.chunks[0].config
        config.finalize_model_grads_func = finalize_model_grads
        no_sync = [model.no_sync for model in self.models]
        config.no_sync_func = no_sync if self.vp_size > 1 else no_sync[0]
        opt_config = OptimizerConfig(
            optimizer="adam",
            lr=optim.lr,
            weight_decay=optim.weight_decay,
            adam_beta1=optim.betas[0],
            adam_beta2=optim.betas[1],
            adam_eps=optim.eps,
            clip_grad=0.0,  # clipped here, after the non-finite check
            use_distributed_optimizer=distributed,
            bf16=self.param_dtype == torch.bfloat16,
            fp16=self.param_dtype == torch.float16,
            params_dtype=self.param_dtype,
        )
        # config_overrides={}: weight decay on every parameter, as FSDPEngine's AdamW (megatron skips biases
        # and norms by default).
        self.optimizer = get_megatron_optimizer(opt_config, self.models, config_overrides={})

    def _chunk_ends(self, stage: int, chunk: int) -> tuple[bool, bool]:
        """Whether pipeline `stage`'s model `chunk` holds the embedding (the first virtual stage) and the
        output layer (the last)."""
        return stage == 0 and chunk == 0, stage == self.pp_size - 1 and chunk == self.vp_size - 1

    def _slots(self, stage: int, chunk: int = 0) -> list[convert.Slot]:
        """The parameters of pipeline `stage`'s model `chunk`: virtual stage chunk x pp + stage, whose
        layers follow those of the virtual stage before it (megatron's interleaved order)."""
        first, last = self._chunk_ends(stage, chunk)
        return convert.slots(
            self.config,
            head=self.head,
            layer_offset=(chunk * self.pp_size + stage) * self.layers_per_chunk,
            num_local_layers=self.layers_per_chunk,
            first_stage=first,
            last_stage=last,
            expert_rank=self.ep_rank,
            expert_parallel=self.ep_size,
        )

    def dispatch_info(self) -> tuple[int, int, bool]:
        return self.dp_rank, self.dp_size, self.tp_rank == 0 and self.cp_rank == 0 and self.last_stage

    # ------------------------------------------------------------------ forward / train
    def forward(self, batch: Batch, fn: ForwardFn, micro_batch_size: int) -> Batch:
        """`fn(output, micro)` per micro-batch under no_grad (on the last stage; its outputs are sent to the
        other stages); per-row tensors on the CPU in the input's row order, on every rank."""
        self._check_onloaded("forward")
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
            self._schedule(micros, on_output, forward_only=True)
        parts = self._from_last_stage(parts)
        return merge_outputs(parts, plan)

    def train_step(self, batch: Batch, loss_fn: LossFn, micro_batch_size: int) -> StepResult:
        if self.optimizer is None:
            raise RuntimeError(
                "train_step on a frozen engine (built with optim=None); give it an OptimConfig"
            )
        self._check_onloaded("train_step")
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
        self._schedule(micros, on_output, forward_only=False, step_tokens=step_tokens, balance=real)
        losses, metrics = self._from_last_stage((losses, dict(metrics)))
        if self._balance is not None:  # each stage's layers' share of the term, summed over the stages
            balance = torch.tensor(self._balance.take_total(), dtype=torch.float64, device=self.device)
            if self.pp_size > 1:
                dist.all_reduce(balance, group=self._pp_group)
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

    def _schedule(
        self,
        micros: list[Batch],
        on_output: Any,
        *,
        forward_only: bool,
        step_tokens: float = 1.0,
        balance: bool = True,
    ) -> None:
        """Every micro-batch through megatron's pipeline schedule; `on_output(output, micro)` on the last
        stage returns the micro-batch's loss (forward only: a zero). `step_tokens`: real tokens of the step
        over the data-parallel ranks (a MoE model's balance term weighs each micro-batch by its share);
        `balance`: add that term (False for a rank's dummy row)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        micros = [micro.to(self.device) for micro in micros]
        filler = None  # a pass that adds nothing, built only where a schedule needs one
        if self.vp_size > 1 or self.ep_size > 1:
            filler = pad_micro_batch(self._pad_id(), self.device, tokens=self.tp_size)
        if self.ep_size > 1:  # the experts' all-to-all needs every rank of an expert group in every pass
            micros += [filler] * (self._max_over_ranks(len(micros)) - len(micros))
        prepared = [self._model_inputs(micro) for micro in micros]
        if self.vp_size > 1:
            # The interleaved schedule: one activation shape for every micro-batch (megatron's shape exchange
            # for variable lengths deadlocks there over gloo), and micro-batches in groups of pp, the last
            # group filled with passes that add nothing.
            shape = tuple(max(shape[i] for shape in self._whole_shapes(prepared)) for i in (0, 1))
            prepared = [self._model_inputs(micro, shape) for micro in micros]
            prepared += [self._model_inputs(filler, shape)] * (-len(prepared) % self.pp_size)
        count = len(prepared)

        def step(data_iterator: Iterator, model: nn.Module) -> tuple[Tensor, Any]:
            micro, inputs, make_output, real = next(data_iterator)
            if self._balance is not None:
                train = balance and not forward_only and micro is not filler
                tokens = (
                    router_rows(real, self.tp_rank, self.tp_size, self.sequence_parallel) if train else None
                )
                self._balance.begin(tokens, real_token_count(micro) / step_tokens, self.dp_size)
            columns_and_order = inputs.get("cp")
            if columns_and_order is not None:  # the rotary embedding at this rank's columns
                for rotary in self._row_rotaries:
                    rotary.columns = columns_and_order[0]
            output_tensor = model(**{k: v for k, v in inputs.items() if k != "cp"})

            def loss_func(logits: Tensor) -> tuple[Tensor, dict]:
                if self._cp_group is not None:  # this rank's columns -> whole rows, the same on the CP group
                    from tandem.engine.megatron.context_parallel import gather_columns

                    logits = gather_columns(logits, self._cp_group, *columns_and_order)
                if micro is filler:  # a pass that adds nothing (an interleaved group's or an expert group's)
                    return logits.sum() * 0.0, {}
                # The schedule divides each micro-batch's loss by their count; the contract sums them.
                return on_output(make_output(logits), micro) * count, {}

            return output_tensor, loss_func

        widths = self._whole_shapes(prepared)
        with self._scope():
            get_forward_backward_func()(
                forward_step_func=step,
                # one iterator per model chunk: each chunk takes every micro-batch in turn
                data_iterator=[iter(prepared) for _ in self.models] if self.vp_size > 1 else iter(prepared),
                model=self.models,
                num_microbatches=count,
                seq_length=max(w[1] for w in widths),
                micro_batch_size=max(w[0] for w in widths),
                forward_only=forward_only,
            )

    def _model_inputs(
        self, micro: Batch, shape: tuple[int, int] | None = None
    ) -> tuple[Batch, dict[str, Tensor], Any, Tensor]:
        """(micro, GPTModel keyword inputs, logits -> ModelOutput, [rows, columns] real tokens of the inputs)
        for one micro-batch.

        Packed: rows of several sequences with a block-diagonal causal mask. Padded: the batch as it is
        with a causal mask over its real tokens. megatron's mask is True where attention is NOT allowed.
        `shape`: (rows, columns) to pad the inputs to (the interleaved schedule's fixed shape); under sequence
        parallel the columns are padded to a multiple of TP. Padding is attended by nothing. Under context
        parallel every packed sequence (a padded row: the row) spans a multiple of 2 x CP (x TP) columns, and
        the inputs hold this rank's chunks of each (`_context_parallel_share`)."""
        ids = micro["input_ids"]
        padded_shape = tuple(ids.shape)
        # the columns are split over the TP ranks (sequence parallel), in 2 chunks per CP rank (context parallel)
        multiple = (self.tp_size if self.sequence_parallel else 1) * (
            2 * self.cp_size if self.cp_size > 1 else 1
        )
        if self.packing and "attention_mask" in micro:  # under CP every sequence splits alike: aligned
            inputs, packing = pack_model_inputs(ids, micro["attention_mask"], self._pad_id(), align=multiple)
            segment = (inputs["position_ids"] == 0).long().cumsum(-1)
            allowed = segment[:, :, None] == segment[:, None, :]
            real = moe.real_tokens(None, inputs["input_ids"].shape, packing).view(inputs["input_ids"].shape)
        else:
            inputs, packing = {"input_ids": ids, "position_ids": micro["position_ids"]}, None
            real = (
                micro["attention_mask"].bool() if "attention_mask" in micro else torch.ones_like(ids).bool()
            )
            allowed = real[:, None, :].expand(-1, ids.shape[1], -1)
        rows, width = inputs["input_ids"].shape
        to_rows, to_width = shape or (rows, width)
        to_width = -(-to_width // multiple) * multiple
        extra_rows, extra = to_rows - rows, to_width - width
        if extra_rows or extra:
            inputs = {
                "input_ids": F.pad(inputs["input_ids"], (0, extra, 0, extra_rows), value=self._pad_id()),
                "position_ids": F.pad(inputs["position_ids"], (0, extra, 0, extra_rows)),
            }
            allowed = F.pad(allowed, (0, extra, 0, extra, 0, extra_rows))
            real = F.pad(real, (0, extra, 0, extra_rows))
        causal = torch.ones(to_width, to_width, dtype=torch.bool, device=ids.device).tril()
        inputs["attention_mask"] = ~(allowed & causal).unsqueeze(1)
        if self.cp_size > 1:
            inputs = self._context_parallel_share(inputs, real if packing is not None else None)

        def make_output(logits: Tensor) -> ModelOutput:
            return ModelOutput(
                logits[:rows, :width], padded_shape, packing, vocab_parallel=self.vocab_parallel
            )

        return micro, inputs, make_output, real

    def _context_parallel_share(
        self, inputs: dict[str, Tensor], packed_real: Tensor | None
    ) -> dict[str, Tensor]:
        """This CP rank's columns of the whole-row inputs (context_parallel.py): its chunks of each sequence
        (`packed_real` [rows, columns]: a packed batch's real tokens, each sequence starting at position 0;
        None: one sequence per row), the mask of its rows against every rank's columns in gathered order, and
        under `cp` the columns (for RowRotary and the output gather)."""
        from tandem.engine.megatron.context_parallel import sequence_columns  # imports megatron

        ids = inputs["input_ids"]
        starts = torch.zeros_like(ids, dtype=torch.bool)
        if packed_real is not None:
            starts = (inputs["position_ids"] == 0) & packed_real
        every = [sequence_columns(starts, rank, self.cp_size) for rank in range(self.cp_size)]
        columns, order = every[self.cp_rank], torch.cat(every, dim=1)
        mask = inputs["attention_mask"]
        rows = mask.gather(2, columns[:, None, :, None].expand(-1, 1, -1, mask.shape[-1]))
        return {
            "input_ids": ids.gather(1, columns),
            "position_ids": inputs["position_ids"].gather(1, columns),
            "attention_mask": rows.gather(3, order[:, None, None, :].expand(-1, 1, columns.shape[1], -1)),
            "cp": (columns, order),
        }

    @staticmethod
    def _whole_shapes(prepared: list[tuple]) -> list[tuple[int, int]]:
        """(rows, columns) of each prepared micro-batch's whole rows (its mask's: a CP rank's inputs hold a
        share of the columns)."""
        return [
            (inputs["input_ids"].shape[0], inputs["attention_mask"].shape[-1]) for _, inputs, *_ in prepared
        ]

    def _micro_batches(self, batch: Batch, micro_batch_size: int) -> tuple[list[Batch], Partition | None]:
        # No agreement over ranks: data-parallel ranks share no collective until the gradient all-reduce.
        return split_micro_batches(
            batch, micro_batch_size, max_tokens=self.max_tokens_per_micro_batch, packing=self.packing
        )

    def _max_over_ranks(self, count: int) -> int:
        value = torch.tensor(count, dtype=torch.int64, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value)

    def _from_last_stage(self, value: Any) -> Any:
        """`value` as the last pipeline stage has it, on every stage (pickled: small per-row outputs)."""
        if self.pp_size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=self._pp_ranks[-1], group=self._pp_group)
        return box[0]

    def _pad_id(self) -> int:
        return self.config.pad_token_id if self.config.pad_token_id is not None else 0

    # ------------------------------------------------------------------ schedule, collectives
    def _set_lr(self) -> None:
        lr = self._peak_lr * self._lr(self._schedule_step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else 0.0

    def scheduler_step(self) -> float:
        if self.optimizer is None:
            raise RuntimeError("scheduler_step on a frozen engine (built with optim=None)")
        self._schedule_step += 1
        self._set_lr()
        return self.lr

    def all_reduce_sum(self, value: Tensor) -> Tensor:
        reduced = value.detach().to(self.device, copy=True)
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM, group=self._dp_group)
        return reduced.to(value.device)

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def state_dict_iter(self) -> Iterator[tuple[str, Tensor]]:
        """(HF name, full tensor on the engine's device), one megatron parameter at a time: its TP cuts
        gathered on its stage, then sent from that stage to the others. Same names as FSDPEngine's (a tied
        lm_head left out). Collective: every rank must iterate to the end."""
        for name, tensor, _, _ in self._stream_weights(None):
            yield name, tensor

    def state_dict_cuts(
        self, cuts_of: Callable[[str, tuple[int, ...]], list[Cut | None]]
    ) -> Iterator[tuple[str, Tensor, Cut | None, torch.Size]]:
        """(HF name, this rank's cut of the tensor, the cut, the whole shape), as FSDPEngine.state_dict_cuts:
        for a tensor-parallel rollout engine whose rank r is this engine's TP rank r (rollout.tensor_parallel =
        actor.megatron.tensor_parallel). Where this TP rank's own cut of a parameter is the rollout's (heads,
        MLP columns and rows, a vocabulary that splits alike), it is taken as it is: no TP gather; other
        tensors are gathered and cut. Pipeline stages send their cuts to the others (same TP rank)."""
        if self.tp_rank != dist.get_rank() % self.tp_size:
            raise RuntimeError(
                f"state_dict_cuts: rank {dist.get_rank()} is megatron TP rank {self.tp_rank}, not rank "
                f"{dist.get_rank() % self.tp_size} of a rollout engine over {self.tp_size} consecutive ranks"
            )
        yield from self._stream_weights(cuts_of)

    def _stream_weights(
        self, cuts_of: Callable[[str, tuple[int, ...]], list[Cut | None]] | None
    ) -> Iterator[tuple[str, Tensor, Cut | None, torch.Size]]:
        """state_dict_iter (`cuts_of` None: whole tensors) and state_dict_cuts."""
        yielded = set()
        experts: dict[str, list[Tensor]] = {}  # a fused MoE tensor: this rank's experts' rows so far
        local_experts = (convert.num_experts(self.config) or 0) // self.ep_size
        me = dist.get_rank()
        for chunk, stage in ((c, s) for c in range(self.vp_size) for s in range(self.pp_size)):
            for slot in self._slots(stage, chunk):
                expert = slot.expert is not None  # one row of a fused [E, ...] tensor, whole on this rank
                shapes = [self._hf_shapes[name][1:] if expert else self._hf_shapes[name] for name in slot.hf]
                wanted = (
                    [None] * len(slot.hf)
                    if cuts_of is None or expert
                    else [cuts_of(name, tuple(self._hf_shapes[name]))[me] for name in slot.hf]
                )
                held = convert.tp_cuts(slot, shapes, self.tp_rank, self.tp_size)
                if stage == self.pp_rank:
                    shard = self.chunks[chunk].get_parameter(slot.megatron).detach()
                    if expert:
                        full = convert.from_shards(slot, [shard], self.shapes)
                    elif wanted == held:  # this TP rank's own cut is what is wanted: no gather
                        full = convert.from_shards(
                            slot, [shard], convert.local_shapes(self.shapes, self.tp_size)
                        )
                    else:
                        full = [
                            _narrow(t, cut)
                            for t, cut in zip(self._gather_tp(slot, shard), wanted, strict=True)
                        ]
                else:
                    full = [
                        torch.empty(_cut_shape(shape, cut), dtype=self.param_dtype, device=self.device)
                        for shape, cut in zip(shapes, wanted, strict=True)
                    ]
                if self.pp_size > 1:
                    for tensor in full:
                        dist.broadcast(tensor, src=self._pp_ranks[stage], group=self._pp_group)
                if expert:
                    rows = experts.setdefault(slot.hf[0], [])
                    rows.append(full[0])
                    if len(rows) < local_experts:
                        continue
                    full = [stack_experts(experts.pop(slot.hf[0]), self._ep_group, self.ep_size)]
                for name, tensor, cut in zip(slot.hf, full, wanted, strict=True):
                    if name not in yielded:  # the last stage's copy of a tied embedding
                        yielded.add(name)
                        yield name, tensor, cut, torch.Size(self._hf_shapes[name])

    def _gather_tp(self, slot: convert.Slot, shard: Tensor) -> list[Tensor]:
        if slot.kind == "rep":
            return [shard]
        if self.tp_size == 1:
            return convert.from_shards(slot, [shard], self.shapes)
        shards = [torch.empty_like(shard) for _ in range(self.tp_size)]
        dist.all_gather(shards, shard.contiguous(), group=self._tp_group)
        return convert.from_shards(slot, shards, self.shapes)

    def export_hf(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        """A Hugging Face folder in `path` (global rank 0 writes; every rank must call)."""
        dtype = dtype or hf_io.export_dtype(self.config)
        writer = dist.get_rank() == 0
        state = {
            name: tensor.to("cpu", dtype=dtype if tensor.is_floating_point() else tensor.dtype)
            for name, tensor in self.state_dict_iter()
            if writer
        }
        if writer:
            config = type(self.config).from_dict(self._export_config)
            hf_io.save_folder(self._hf_class, config, state, path, dtype=dtype, source_path=self.model_path)
        dist.barrier()


def _narrow(tensor: Tensor, cut: Cut | None) -> Tensor:
    return tensor if cut is None else tensor.narrow(cut.dim, cut.start, cut.length)


def _cut_shape(shape: tuple[int, ...], cut: Cut | None) -> tuple[int, ...]:
    return (
        tuple(shape) if cut is None else tuple(cut.length if d == cut.dim else n for d, n in enumerate(shape))
    )
