"""How `MegatronEngine` (engine.py) builds its model: megatron's TransformerConfig from the Hugging Face config,
this rank's GPTModel chunks (one per virtual pipeline stage) filled with their cuts of the folder's weights
(convert.py), and megatron's DDP and optimizer around them when trainable.

`ModelBuild` is a part of `MegatronEngine`, kept apart for length: what it reads of the engine is `BuildHost`
(tests/engine/test_host_contracts.py checks that MegatronEngine provides each entry and that the mixin reads no
other); it keeps the TransformerConfig as `_layer_split`, each chunk's LoRA adapters as `_adapters` (lora.py), and sets
`models` (DDP-wrapped) and `optimizer`."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor, nn

from tandem.config.megatron_overrides import CUDA_ONLY, resolved_overrides
from tandem.config.schema import MegatronConfig, OptimConfig
from tandem.engine import hf_io
from tandem.engine.base import Head
from tandem.engine.fsdp import lora as fsdp_lora
from tandem.engine.megatron import convert, dist_start
from tandem.engine.megatron import lora as megatron_lora
from tandem.engine.megatron.layers import ValueHead, layer_spec
from tandem.engine.megatron.parallel import ParallelLayout
from tandem.train_engine_options import lora_init_a


class BuildHost(Protocol):
    """What `ModelBuild` reads of the MegatronEngine it is part of."""

    layout: ParallelLayout  # this rank's ranks, sizes and process groups (parallel.py)
    config: Any  # the model's Hugging Face config
    head: Head
    model_path: str
    param_dtype: torch.dtype
    device: torch.device
    shapes: convert.Shapes
    chunks: list[nn.Module]  # this rank's model chunks, one per virtual stage
    _row_rotaries: list[nn.Module]  # context parallel: each chunk's RowRotary
    router_replay: bool  # routers built with megatron's replay (actor.router_replay)


class ModelBuild:
    """The model chunks, their weights and the optimizer of a MegatronEngine."""

    def _transformer_config(self, activation_checkpointing: bool, megatron: MegatronConfig) -> Any:
        from megatron.core.transformer import TransformerConfig

        extra: dict[str, Any] = {}
        if activation_checkpointing:
            extra = {
                "recompute_granularity": "full",
                "recompute_method": "uniform",
                "recompute_num_layers": 1,
            }
        if megatron.override_transformer_config.get("recompute_granularity") == "selective":
            extra = {}  # selective recomputes parts of each layer: no method / number of layers
        # megatron.override_transformer_config over Tandem's choices (the keys Tandem must set are refused)
        extra.update(resolved_overrides("transformer", megatron, self.device.type == "cuda"))
        fusions = {key: extra.pop(key) for key in CUDA_ONLY if key in extra}
        return TransformerConfig(
            **convert.transformer_config_kwargs(self.config),
            **convert.moe_config_kwargs(self.config, self.layout.ep_size),
            tensor_model_parallel_size=self.layout.tp_size,
            pipeline_model_parallel_size=self.layout.pp_size,
            virtual_pipeline_model_parallel_size=self.layout.vp_size if self.layout.vp_size > 1 else None,
            sequence_parallel=self.layout.sequence_parallel,
            context_parallel_size=self.layout.cp_size,
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
            variable_seq_lengths=self.layout.vp_size == 1,
            moe_token_dispatcher_type="alltoall",  # megatron asks for it with variable_seq_lengths
            moe_enable_routing_replay=self.router_replay,  # router replay (experts.RouterTape)
            # The fused kernels are CUDA-only or need Apex / Transformer Engine; the torch paths compute the same.
            # override_transformer_config turns them on, on CUDA only (config/megatron_overrides.py).
            **{
                "masked_softmax_fusion": False,
                "bias_activation_fusion": False,
                "bias_dropout_fusion": False,
                "apply_rope_fusion": False,
                "gradient_accumulation_fusion": False,
                "persist_layer_norm": False,
                **fusions,
            },
            # Point-to-point sends one at a time, not batched: under PP = 2 a stage's previous and next stage are
            # the same rank, and in the interleaved schedule's steady state a stage sends that rank an activation
            # (forward) and a gradient (backward) in one exchange. Batched, megatron posts [send to prev, recv
            # from prev, send to next, recv from next] on both ranks, so the two messages of one direction
            # arrive in the other order than the receives were posted (gloo matches a pair's messages to its
            # receives in posting order); both have the activation's shape, so activation and gradient were
            # swapped with no error (issue 44: the update's log-probs differed from the forward's from the third
            # micro-batch on). The unbatched path orders sends and receives by the ranks' parity and, for a
            # 2-rank pipeline, sends each direction on its own process group.
            batch_p2p_comm=False,
            **extra,
        )

    def _build(
        self,
        activation_checkpointing: bool,
        seed: int,
        megatron: MegatronConfig,
        start: tuple[str, str] | None = None,
        lora: Any = None,
    ) -> tuple[list[nn.Module], type, dict[str, tuple]]:
        """This rank's model chunks (one per virtual stage; one without virtual_pipeline), each filled with its
        cut of the folder's weights; `start` (folder, its setting's name): from that megatron distributed
        checkpoint instead (dist_start.py), the folder giving the architecture alone. `lora` (actor.lora, on):
        adapters on the chunks' linears, every other weight frozen (lora.py)."""
        from megatron.core.models.gpt import GPTModel

        if lora is not None and start is not None:
            raise ValueError(
                f"actor.lora with {start[1]}: LoRA's adapters start from the Hugging Face folder's model; convert "
                "the checkpoint to a folder first (`tandem convert mcore-to-hf`) and start from that"
            )

        tied = self.head == "lm" and bool(getattr(self.config, "tie_word_embeddings", False))
        config = self._transformer_config(
            activation_checkpointing, megatron
        )  # one object: the schedule reads it
        self._layer_split = config  # each chunk's layers, as megatron splits them (`_chunk_layers`)
        if start is None:
            hf_model = hf_io.load_pretrained(self.model_path, self.config, self.head, seed)
            hf_state: dict[str, Tensor] | None = hf_model.state_dict()
        else:  # no weights read from the folder: its architecture's names and shapes only
            hf_model, hf_state = hf_io.build_on_meta(self.config, self.head), None
        hf_shapes = {name: tuple(t.shape) for name, t in hf_model.state_dict().items()}
        self._adapters: list[dict[str, megatron_lora.LinearAdapters]] = []
        if lora is not None:  # PEFT's adapters on the Hugging Face model, as the FSDP2 engine puts them
            fsdp_lora.inject(hf_model, lora, seed, init_a=lora_init_a("megatron", lora.init_a))
            fsdp_lora.refuse_fused_adapters(hf_model, lora)  # no expert adapters here: FSDP2 builds them
            fsdp_lora.load_saved_adapter(hf_model, lora)  # actor.lora.adapter_path's weights, if any
        inv_freq = convert.rotary_inv_freq(self.config)
        chunks = []
        for chunk in range(self.layout.vp_size):
            first, last = self._chunk_ends(self.layout.pp_rank, chunk)
            model = GPTModel(
                config,
                layer_spec(
                    self.layout.sequence_parallel,
                    self._chunk_layers(self.layout.pp_rank, chunk)[1],
                    convert.num_experts(self.config),
                    context_parallel=self.layout.cp_size > 1,
                    qk_layernorm=convert.qk_norm(self.config),
                ),
                vocab_size=self.config.vocab_size,
                max_sequence_length=self.config.max_position_embeddings,
                pre_process=first,
                post_process=last,
                share_embeddings_and_output_weights=tied,
                position_embedding_type="rope",
                rotary_base=convert.rotary_base(self.config),
                **({"vp_stage": chunk} if self.layout.vp_size > 1 else {}),
            )
            # a scaled RoPE (llama3): transformers' frequencies (convert.rotary_inv_freq)
            if inv_freq is not None:
                model.rotary_pos_emb.inv_freq = inv_freq.clone()
            if self.head == "value" and last:
                model.output_layer = ValueHead(
                    self.config.hidden_size, self.param_dtype, self.layout.sequence_parallel
                )
            if self.layout.cp_size > 1:  # rotary positions of each row's own columns (context_parallel.py)
                from tandem.engine.megatron.context_parallel import RowRotary

                model.rotary_pos_emb = RowRotary(model.rotary_pos_emb)
                self._row_rotaries.append(model.rotary_pos_emb)
            if hf_state is not None:
                self._fill(model, self._slots(self.layout.pp_rank, chunk), hf_state)
            elif (
                self.head == "value" and last
            ):  # as the folder's missing `score` (a checkpoint's own head wins)
                dist_start.value_head_init(model.output_layer, self.config, seed)
            # megatron builds its torch norms in float32 whatever params_dtype says (its own training loop
            # casts the whole model, Float16Module); buffers keep their dtype
            for param in model.parameters():
                param.data = param.data.to(self.param_dtype)
            model.to(self.device)
            if lora is not None:
                self._adapters.append(
                    megatron_lora.attach(
                        model,
                        self._slots(self.layout.pp_rank, chunk),
                        hf_model,
                        hf_shapes,
                        self.shapes,
                        self.layout.tp_rank,
                        self.layout.tp_size,
                        self.layout.tp_group,
                        self.layout.sequence_parallel,
                        self.param_dtype,
                    )
                )
            chunks.append(model)
        if start is not None:
            dist_start.load_start_weights(chunks, start[0], start[1], self.head)
        hf_class = type(hf_model)
        del hf_model, hf_state
        return chunks, hf_class, hf_shapes

    def _fill(self, model: nn.Module, slots: list[convert.Slot], hf_state: dict[str, Tensor]) -> None:
        filled = set()
        for slot in slots:
            param = model.get_parameter(slot.megatron)
            tp_rank, tp_size = (
                (0, 1) if slot.expert is not None else (self.layout.tp_rank, self.layout.tp_size)
            )
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

    def _build_optimizer(self, optim: OptimConfig, megatron: MegatronConfig) -> None:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        # megatron's distributed optimizer takes CUDA tensors only (it checks their type names).
        distributed = megatron.distributed_optimizer and self.device.type == "cuda"
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
        config.no_sync_func = no_sync if self.layout.vp_size > 1 else no_sync[0]
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
            **resolved_overrides("optimizer", megatron, self.device.type == "cuda"),
        )
        # config_overrides={}: weight decay on every parameter, as FSDPEngine's AdamW (megatron skips biases
        # and norms by default).
        self.optimizer = get_megatron_optimizer(opt_config, self.models, config_overrides={})

    def _chunk_ends(self, stage: int, chunk: int) -> tuple[bool, bool]:
        """Whether pipeline `stage`'s model `chunk` holds the embedding (the first virtual stage) and the
        output layer (the last)."""
        return (
            stage == 0 and chunk == 0,
            stage == self.layout.pp_size - 1 and chunk == self.layout.vp_size - 1,
        )

    def _chunk_layers(self, stage: int, chunk: int) -> tuple[int, int]:
        """(first layer, number of layers) of pipeline `stage`'s model `chunk`, by megatron's own split: even,
        or with the first / last stage's sizes of override_transformer_config (num_layers_in_first_pipeline_stage,
        ..., account_for_embedding / loss_in_pipeline_split); interleaved, virtual stage chunk x pp + stage
        follows the virtual stage before it."""
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        vp_stage = chunk if self.layout.vp_size > 1 else None
        return (
            get_transformer_layer_offset(self._layer_split, vp_stage=vp_stage, pp_rank=stage),
            get_num_layers_to_build(self._layer_split, vp_stage=vp_stage, pp_rank=stage),
        )

    def _slots(self, stage: int, chunk: int = 0) -> list[convert.Slot]:
        """The parameters of pipeline `stage`'s model `chunk` (`_chunk_layers`)."""
        first, last = self._chunk_ends(stage, chunk)
        offset, count = self._chunk_layers(stage, chunk)
        return convert.slots(
            self.config,
            head=self.head,
            layer_offset=offset,
            num_local_layers=count,
            first_stage=first,
            last_stage=last,
            expert_rank=self.layout.ep_rank,
            expert_parallel=self.layout.ep_size,
        )
