"""How `MegatronEngine` (engine.py) builds its model: megatron's TransformerConfig from the Hugging Face config,
this rank's GPTModel chunks (one per virtual pipeline stage) filled with their cuts of the folder's weights
(convert.py), and megatron's DDP and optimizer around them when trainable.

Functions over the engine's `ParallelLayout` and explicit arguments, as torchtitan's build functions: `build_model`
returns what the engine keeps of its model (`BuiltModel`: the chunks, each chunk's LoRA adapters, ...) and
`build_optimizer` the DDP-wrapped chunks and megatron's optimizer. `ChunkMap` says which layers and parameters each
model chunk of each pipeline stage holds (the build fills them; weights.py streams them out)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


class ChunkMap:
    """Which layers and which parameters (convert.py's slots) each model chunk of each pipeline stage holds, by
    megatron's own split of the layers.

    Args:
        layout: this rank's place in megatron's layout (parallel.py).
        hf_config: the model's Hugging Face config.
        head: the model's head ("lm" or "value").
        layer_split: the TransformerConfig the chunks are built with (its pipeline split of the layers).
    """

    def __init__(self, layout: ParallelLayout, hf_config: Any, head: Head, layer_split: Any) -> None:
        self.layout, self.hf_config, self.head, self.layer_split = layout, hf_config, head, layer_split

    def ends(self, stage: int, chunk: int) -> tuple[bool, bool]:
        """Whether pipeline `stage`'s model `chunk` holds the embedding (the first virtual stage) and the
        output layer (the last)."""
        return (
            stage == 0 and chunk == 0,
            stage == self.layout.pp_size - 1 and chunk == self.layout.vp_size - 1,
        )

    def layers(self, stage: int, chunk: int) -> tuple[int, int]:
        """(first layer, number of layers) of pipeline `stage`'s model `chunk`, by megatron's own split: even,
        or with the first / last stage's sizes of override_transformer_config (num_layers_in_first_pipeline_stage,
        ..., account_for_embedding / loss_in_pipeline_split); interleaved, virtual stage chunk x pp + stage
        follows the virtual stage before it."""
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        vp_stage = chunk if self.layout.vp_size > 1 else None
        return (
            get_transformer_layer_offset(self.layer_split, vp_stage=vp_stage, pp_rank=stage),
            get_num_layers_to_build(self.layer_split, vp_stage=vp_stage, pp_rank=stage),
        )

    def slots(self, stage: int, chunk: int = 0) -> list[convert.Slot]:
        """The parameters of pipeline `stage`'s model `chunk` (`layers`)."""
        first, last = self.ends(stage, chunk)
        offset, count = self.layers(stage, chunk)
        return convert.slots(
            self.hf_config,
            head=self.head,
            layer_offset=offset,
            num_local_layers=count,
            first_stage=first,
            last_stage=last,
            expert_rank=self.layout.ep_rank,
            expert_parallel=self.layout.ep_size,
        )


@dataclass(frozen=True)
class BuiltModel:
    """What `build_model` made: this rank's model chunks and what the engine's parts read of them."""

    chunks: list[nn.Module]  # one per virtual pipeline stage
    chunk_map: ChunkMap  # each chunk's layers and parameters
    hf_class: type  # the Hugging Face model class (export_hf writes its folder)
    hf_shapes: dict[str, tuple]  # each Hugging Face weight's whole shape
    adapters: list[dict[str, nn.Module]]  # each chunk's LoRA adapters (lora.py; [] without LoRA)
    row_rotaries: list[nn.Module]  # context parallel: each chunk's RowRotary ([] without)


def transformer_config(
    hf_config: Any,
    layout: ParallelLayout,
    param_dtype: torch.dtype,
    device: torch.device,
    activation_checkpointing: bool,
    megatron: MegatronConfig,
    router_replay: bool,
) -> Any:
    """megatron's TransformerConfig of the model of `hf_config` under `layout`, with Tandem's choices and
    megatron.override_transformer_config over them; `router_replay`: routers built with megatron's replay."""
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
    extra.update(resolved_overrides("transformer", megatron, device.type == "cuda"))
    fusions = {key: extra.pop(key) for key in CUDA_ONLY if key in extra}
    return TransformerConfig(
        **convert.transformer_config_kwargs(hf_config),
        **convert.moe_config_kwargs(hf_config, layout.ep_size),
        tensor_model_parallel_size=layout.tp_size,
        pipeline_model_parallel_size=layout.pp_size,
        virtual_pipeline_model_parallel_size=layout.vp_size if layout.vp_size > 1 else None,
        sequence_parallel=layout.sequence_parallel,
        context_parallel_size=layout.cp_size,
        params_dtype=param_dtype,
        pipeline_dtype=param_dtype,
        bf16=param_dtype == torch.bfloat16,
        fp16=param_dtype == torch.float16,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        # Overwritten from the folder next, but megatron's CPU initialisation is also what marks weights as
        # tensor-parallel: without it the gradient norm counts rank 0's shards only.
        perform_initialization=True,
        # micro-batches differ in shape (token budget, packing); the interleaved schedule pads them to one
        variable_seq_lengths=layout.vp_size == 1,
        moe_token_dispatcher_type="alltoall",  # megatron asks for it with variable_seq_lengths
        moe_enable_routing_replay=router_replay,  # router replay (experts.RouterTape)
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


def build_model(
    layout: ParallelLayout,
    hf_config: Any,
    head: Head,
    model_path: str,
    param_dtype: torch.dtype,
    device: torch.device,
    shapes: convert.Shapes,
    *,
    activation_checkpointing: bool,
    seed: int,
    megatron: MegatronConfig,
    router_replay: bool,
    start: tuple[str, str] | None = None,
    lora: Any = None,
) -> BuiltModel:
    """This rank's model chunks (one per virtual stage; one without virtual_pipeline), each filled with its
    cut of the folder's weights; `start` (folder, its setting's name): from that megatron distributed
    checkpoint instead (dist_start.py), the folder giving the architecture alone. `lora` (actor.lora, on):
    adapters on the chunks' linears, every other weight frozen (lora.py). Returns the chunks and what the
    engine's parts read of them (`BuiltModel`)."""
    from megatron.core.models.gpt import GPTModel

    if lora is not None and start is not None:
        raise ValueError(
            f"actor.lora with {start[1]}: LoRA's adapters start from the Hugging Face folder's model; convert "
            "the checkpoint to a folder first (`tandem convert mcore-to-hf`) and start from that"
        )

    tied = head == "lm" and bool(getattr(hf_config, "tie_word_embeddings", False))
    mcore_config = transformer_config(
        hf_config, layout, param_dtype, device, activation_checkpointing, megatron, router_replay
    )  # one object: the schedule reads it
    chunk_map = ChunkMap(
        layout, hf_config, head, mcore_config
    )  # each chunk's layers, as megatron splits them
    if start is None:
        hf_model = hf_io.load_pretrained(model_path, hf_config, head, seed)
        hf_state: dict[str, Tensor] | None = hf_model.state_dict()
    else:  # no weights read from the folder: its architecture's names and shapes only
        hf_model, hf_state = hf_io.build_on_meta(hf_config, head), None
    hf_shapes = {name: tuple(t.shape) for name, t in hf_model.state_dict().items()}
    adapters: list[dict[str, nn.Module]] = []
    row_rotaries: list[nn.Module] = []
    if lora is not None:  # PEFT's adapters on the Hugging Face model, as the FSDP2 engine puts them
        fsdp_lora.inject(hf_model, lora, seed, init_a=lora_init_a("megatron", lora.init_a))
        fsdp_lora.load_saved_adapter(hf_model, lora)  # actor.lora.adapter_path's weights, if any
    inv_freq = convert.rotary_inv_freq(hf_config)
    chunks = []
    for chunk in range(layout.vp_size):
        first, last = chunk_map.ends(layout.pp_rank, chunk)
        model = GPTModel(
            mcore_config,
            layer_spec(
                layout.sequence_parallel,
                chunk_map.layers(layout.pp_rank, chunk)[1],
                convert.num_experts(hf_config),
                context_parallel=layout.cp_size > 1,
                qk_layernorm=convert.qk_norm(hf_config),
            ),
            vocab_size=hf_config.vocab_size,
            max_sequence_length=hf_config.max_position_embeddings,
            pre_process=first,
            post_process=last,
            share_embeddings_and_output_weights=tied,
            position_embedding_type="rope",
            rotary_base=convert.rotary_base(hf_config),
            **({"vp_stage": chunk} if layout.vp_size > 1 else {}),
        )
        # a scaled RoPE (llama3): transformers' frequencies (convert.rotary_inv_freq)
        if inv_freq is not None:
            model.rotary_pos_emb.inv_freq = inv_freq.clone()
        if head == "value" and last:
            model.output_layer = ValueHead(hf_config.hidden_size, param_dtype, layout.sequence_parallel)
        if layout.cp_size > 1:  # rotary positions of each row's own columns (context_parallel.py)
            from tandem.engine.megatron.context_parallel import RowRotary

            model.rotary_pos_emb = RowRotary(model.rotary_pos_emb)
            row_rotaries.append(model.rotary_pos_emb)
        if hf_state is not None:
            _fill(model, chunk_map.slots(layout.pp_rank, chunk), hf_state, shapes, layout, model_path)
        elif head == "value" and last:  # as the folder's missing `score` (a checkpoint's own head wins)
            dist_start.value_head_init(model.output_layer, hf_config, seed)
        # megatron builds its torch norms in float32 whatever params_dtype says (its own training loop
        # casts the whole model, Float16Module); buffers keep their dtype
        for param in model.parameters():
            param.data = param.data.to(param_dtype)
        model.to(device)
        if lora is not None:
            adapters.append(
                megatron_lora.attach(
                    model,
                    chunk_map.slots(layout.pp_rank, chunk),
                    hf_model,
                    hf_shapes,
                    shapes,
                    layout.tp_rank,
                    layout.tp_size,
                    layout.tp_group,
                    layout.sequence_parallel,
                    param_dtype,
                )
            )
        chunks.append(model)
    if start is not None:
        dist_start.load_start_weights(chunks, start[0], start[1], head)
    hf_class = type(hf_model)
    del hf_model, hf_state
    return BuiltModel(chunks, chunk_map, hf_class, hf_shapes, adapters, row_rotaries)


def _fill(
    model: nn.Module,
    slots: list[convert.Slot],
    hf_state: dict[str, Tensor],
    shapes: convert.Shapes,
    layout: ParallelLayout,
    model_path: str,
) -> None:
    filled = set()
    for slot in slots:
        param = model.get_parameter(slot.megatron)
        tp_rank, tp_size = (0, 1) if slot.expert is not None else (layout.tp_rank, layout.tp_size)
        shard = convert.to_shard(slot, [hf_state[n] for n in slot.hf], shapes, tp_rank, tp_size)
        if tuple(shard.shape) != tuple(param.shape):
            raise ValueError(
                f"{model_path}: {slot.hf} give {slot.megatron} the shape {tuple(shard.shape)}, megatron "
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


def build_optimizer(
    chunks: list[nn.Module],
    optim: OptimConfig,
    megatron: MegatronConfig,
    layout: ParallelLayout,
    param_dtype: torch.dtype,
    device: torch.device,
) -> tuple[list[nn.Module], Any]:
    """megatron's DDP around each chunk and megatron's optimizer over them: (the wrapped chunks, the optimizer)."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    # megatron's distributed optimizer takes CUDA tensors only (it checks their type names).
    distributed = megatron.distributed_optimizer and device.type == "cuda"
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=distributed
    )
    # One DDP per chunk; only the first buckets its gradients (as megatron's own training loop does).
    models = [
        DistributedDataParallel(chunk.config, ddp_config, chunk, disable_bucketing=i > 0)
        for i, chunk in enumerate(chunks)
    ]
    config = chunks[0].config
    config.finalize_model_grads_func = finalize_model_grads
    no_sync = [model.no_sync for model in models]
    config.no_sync_func = no_sync if layout.vp_size > 1 else no_sync[0]
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        adam_beta1=optim.betas[0],
        adam_beta2=optim.betas[1],
        adam_eps=optim.eps,
        clip_grad=0.0,  # clipped here, after the non-finite check
        use_distributed_optimizer=distributed,
        bf16=param_dtype == torch.bfloat16,
        fp16=param_dtype == torch.float16,
        params_dtype=param_dtype,
        **resolved_overrides("optimizer", megatron, device.type == "cuda"),
    )
    # config_overrides={}: weight decay on every parameter, as FSDPEngine's AdamW (megatron skips biases
    # and norms by default).
    return models, get_megatron_optimizer(opt_config, models, config_overrides={})
