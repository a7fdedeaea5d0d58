"""How `FSDPEngine` (engine.py) builds its model: the Hugging Face model read on rank 0 (meta elsewhere), LoRA
adapters injected, every decoder layer and the root `fully_shard`-ed, the weights broadcast into the shards;
`fsdp.torch_compile`'s per-layer compile and warm-up; the start-up probes that switch packing and the
chunked LM head off for a model they would change the numbers of.

Functions over explicit arguments, as torchtitan's build functions are: what they share of the engine is
`BuildFacts`, a frozen value the engine makes once its Hugging Face config is read; a probe that runs the model
takes the engine's model call (`ModelForward`) as an argument. Each returns what the engine keeps."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from tandem.batch import Batch
from tandem.config.schema import FSDPConfig, LoraConfig
from tandem.engine import hf_io, kernels
from tandem.engine.base import DTYPES, Head, ModelOutput
from tandem.engine.fsdp import lora as lora_layers
from tandem.engine.fsdp.vision import vision_tower
from tandem.train_engine_options import lora_init_a

logger = logging.getLogger(__name__)

VALUE_HEAD = ("score",)  # a value model's head (transformers' token classifiers): trained whole under LoRA
_warned_cpu_offload = False
LAYER_GRAPHS = 16  # the recompile limit while decoder layers are compiled (compile_layers)
_LAYER_BACKEND = "inductor"  # torch.compile's backend for fsdp.torch_compile (a test swaps in a failing one)


def compile_layers_wanted(setting: bool | str, device: torch.device, sequence_parallel: int) -> bool:
    """`fsdp.torch_compile`: true, false, or auto: on CUDA without sequence parallel. There issue 33 measured
    the 0.5 B update 1.14x faster compiled on an H200 (1.75 s to 1.53 s; 32 s of compile, paid once at start-up
    and won back within a few RL steps of real size). A CPU keeps eager layers under auto: bench/README.md's
    compiled rows run at 0.78x (W1) to 0.99x (100 M) of eager there. Sequence parallel's all-to-all inside
    compiled layers is untested, so auto leaves them eager (true is refused there, engine/fsdp/ulysses.py)."""
    if setting != "auto":
        return bool(setting)
    return device.type == "cuda" and sequence_parallel == 1


# The engine's model call on one micro-batch: (micro, packed=None, chunk=-1, router=False) -> ModelOutput, with
# packed / chunk defaulting to how the engine is set (FSDPEngine._model_forward)
ModelForward = Callable[..., ModelOutput]


@dataclass(frozen=True)
class BuildFacts:
    """What the model's build and the start-up probes read of the engine, fixed before the model is built."""

    model_path: str
    head: Head
    config: Any  # the model's Hugging Face config (dropout off, no KV cache)
    rank: int
    world_size: int  # the model is sharded over every rank of the default group
    device: torch.device
    param_dtype: torch.dtype  # the forward / backward dtype
    vocab_size: int


def build_model(
    facts: BuildFacts,
    fsdp: FSDPConfig,
    lora: LoraConfig | None,
    offload: CPUOffloadPolicy | None,
    activation_checkpointing: bool,
    seed: int,
    freeze_vision_tower: bool = False,
) -> tuple[torch.nn.Module, type, list[str]]:
    """The model read, adapted (LoRA, the vision tower frozen) and sharded; returns it, its Hugging Face
    class and the names of its state_dict."""
    is_source = facts.rank == 0
    if is_source:
        model = hf_io.load_pretrained(facts.model_path, facts.config, facts.head, seed)
        full_state = model.state_dict()  # references; survive the sharding below
    else:
        model = hf_io.build_on_meta(facts.config, facts.head)
        full_state = {}
    hf_class = type(model)  # fully_shard swaps in a subclass; export writes the original
    if fsdp.model_dtype != "float32":  # weights kept in bf16 (buffers, e.g. rotary frequencies: fp32)
        _keep_parameters_in(model, DTYPES[fsdp.model_dtype])
    if fsdp.liger:  # fused elementwise kernels, in place; parameter names unchanged (engine/kernels.py)
        kernels.apply_liger(model)
    if lora is not None:  # adapters in place, before the state is taken and the layers are sharded
        lora_layers.inject(
            model,
            lora,
            seed,
            whole=VALUE_HEAD if facts.head == "value" else (),
            init_a=lora_init_a("fsdp", lora.init_a),
        )
        if is_source:
            lora_layers.load_saved_adapter(model, lora)  # actor.lora.adapter_path's weights, if any
            full_state = model.state_dict()
    if freeze_vision_tower:  # before sharding: FSDP2 makes no gradient for a frozen parameter
        vision_tower(model).requires_grad_(False)
    state_keys = hf_io.persistent_keys(model)
    if activation_checkpointing:
        hf_io.enable_activation_checkpointing(model)

    mp_policy = MixedPrecisionPolicy(param_dtype=facts.param_dtype, reduce_dtype=DTYPES[fsdp.reduce_dtype])
    shard_kwargs: dict[str, Any] = {
        "mesh": init_device_mesh(facts.device.type, (facts.world_size,)),  # sharded over every rank
        "mp_policy": mp_policy,
    }
    if offload is not None:
        shard_kwargs["offload_policy"] = offload
    layers = hf_io.decoder_layers(model)
    if not layers:
        logger.warning(
            "no decoder layers found in %s: sharding the whole model as one unit", hf_class.__name__
        )
    for layer in layers:
        fully_shard(layer, **shard_kwargs)
    # Root last: embeddings, final norm and heads (tied lm_head / embed_tokens stay one parameter).
    fully_shard(model, **shard_kwargs)

    if not is_source:
        # Sharded parameters live on the CPU under CPU offload; buffers always on the compute device.
        model.to_empty(device="cpu" if offload is not None else facts.device)
        _move_buffers(model, facts.device)
    with torch.no_grad():
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)
    set_model_state_dict(
        model,
        full_state,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    del full_state
    return model, hf_class, state_keys


def compile_layers(
    setting: bool | str,
    model: torch.nn.Module,
    forward: ModelForward,
    facts: BuildFacts,
    hf_class: type,
    trainable: bool,
    one_packed_row: bool,
) -> float | None:
    """`fsdp.torch_compile`: each decoder layer compiled in place (`Module.compile`, so the parameter names
    stay the HF ones and FSDP2's hooks stay on the layers), with dynamic shapes: packed rows are one
    [1, tokens] row whose length changes every micro-batch. Compiling happens on a layer's first call with
    each new guard (`_warm_up_layers` lists them); the warm-up pays it here, timed and logged, so no step's
    time holds it. Returns the warm-up's seconds. A case the warm-up did not foresee compiles on first use
    (torch recompiles by itself, up to its recompile limit, raised to LAYER_GRAPHS here).

    Under `auto` a warm-up that fails (inductor's errors have no common type) is a warning: the layers go
    back to eager (`Module.compile` only sets `_compiled_call_impl`), every FSDP unit is resharded, and the
    warm-up's passes run again eagerly, so the engine starts from the state an eager one would; None is
    returned. Under `true` it is an error naming the key. `forward`: the engine's model call; `trainable`: the
    warm-up runs a training pass too (an engine with an optimizer); `one_packed_row`: packing with a varlen
    kernel, whose micro-batches are one packed row."""
    layers = hf_io.decoder_layers(model)
    if not layers:
        if setting == "auto":
            logger.warning(
                "fsdp.torch_compile=auto: no decoder layers found in %s; nothing compiled", hf_class.__name__
            )
            return None
        raise ValueError(
            f"fsdp.torch_compile=true: no decoder layers found in {hf_class.__name__} to compile; "
            "set fsdp.torch_compile=false"
        )
    # the guards above multiply: up to 12 graphs (LoRA, sdpa), past torch's default limit of 8 per function,
    # after which a layer would run eager in the cases left over
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, LAYER_GRAPHS)
    for layer in layers:
        layer.compile(dynamic=True, backend=_LAYER_BACKEND)
    start = time.perf_counter()
    try:
        _warm_up_layers(model, forward, facts, trainable, one_packed_row)
    except Exception as error:
        for layer in layers:
            layer._compiled_call_impl = None
        reshard_all(model)
        if setting != "auto":
            raise RuntimeError(
                f"actor.fsdp.torch_compile=true: torch.compile of the decoder layers of "
                f"{hf_class.__name__} failed on {facts.device.type} ({type(error).__name__}: {error}); "
                "set actor.fsdp.torch_compile=false"
            ) from error
        logger.warning(
            "actor.fsdp.torch_compile=auto: torch.compile of the decoder layers of %s failed on %s (%s: %s); "
            "the layers run eager",
            hf_class.__name__,
            facts.device.type,
            type(error).__name__,
            error,
        )
        # the same passes eagerly: the engine's state is an eager engine's
        _warm_up_layers(model, forward, facts, trainable, one_packed_row)
        return None
    seconds = time.perf_counter() - start
    logger.info(
        "fsdp.torch_compile: %d decoder layers of %s compiled in %.1f s (warm-up, %s)",
        len(layers),
        hf_class.__name__,
        seconds,
        "training and no-grad passes" if trainable else "no-grad pass",
    )
    return seconds


def _warm_up_layers(
    model: torch.nn.Module, forward: ModelForward, facts: BuildFacts, trainable: bool, one_packed_row: bool
) -> None:
    """`compile_layers`' passes: a training pass and its backward (a trainable engine), then a no-grad
    pass, over each kind of micro-batch the layers will see. No gradient is kept.

    What makes a layer compile anew is a new guard, not a new length (the lengths are dynamic): each grad
    mode, whether the layer's input wants a gradient (under LoRA the first layer's does not), and, but for a
    varlen kernel, a mask tensor or None (sdpa and eager get no mask where no row is padded or holds two
    sequences) and a batch of one row or of more. A varlen kernel's micro-batches are always one packed row
    without a mask (two sequences here); the others get 2 rows with padding, 1 row with and without, and 2
    rows without, as packed or padded micro-batches make them."""

    def micro(*lengths: int, width: int | None = None) -> Batch:
        width = width or max(lengths)
        mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths], device=facts.device)
        ids = (torch.arange(mask.numel(), device=facts.device).view(mask.shape) * 3 + 1) % facts.vocab_size
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return Batch({"input_ids": ids * mask, "attention_mask": mask, "position_ids": positions})

    if one_packed_row:
        shapes = [micro(4, 7)]
    else:
        shapes = [micro(4, 7), micro(4, width=7), micro(7), micro(7, 7)]
    try:
        for batch in shapes:
            if trainable:
                model.train()
                forward(batch).zero_loss().backward()
            model.eval()
            with torch.no_grad():
                forward(batch)
    finally:
        for param in model.parameters():
            param.grad = None
    model.reshard()


def reshard_all(model: torch.nn.Module) -> None:
    """Every FSDP unit back to its shards (after a pass that stopped half-way, some stay unsharded)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def offload_policy(cpu_offload: bool, device: torch.device) -> CPUOffloadPolicy | None:
    """fsdp.cpu_offload's policy: parameters, gradients and optimizer state in host memory (CUDA only)."""
    global _warned_cpu_offload
    if not cpu_offload:
        return None
    if device.type != "cuda":
        if not _warned_cpu_offload:
            logger.info("fsdp.cpu_offload on device %s: nothing to offload, ignored", device)
            _warned_cpu_offload = True
        return None
    return CPUOffloadPolicy()


@torch.no_grad()
def chunked_head_works(
    model: torch.nn.Module, forward: ModelForward, facts: BuildFacts, chunk: int, hf_class: type
) -> bool:
    """Whether this model's logits are exactly its output embedding of the last hidden states (no
    soft-capping or scaling after it): a probe's logits both ways, the head `chunk` tokens at a time. Otherwise
    the plain head, warned."""
    ids = torch.arange(6, device=facts.device).view(1, 6) * 5 % facts.vocab_size
    positions = torch.arange(6, device=facts.device).view(1, 6)
    probe = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": positions})
    model.eval()
    plain = forward(probe, packed=False, chunk=None).logits.float()
    chunked = forward(probe, packed=False, chunk=chunk)
    remade = F.linear(chunked.logits, chunked.head.weight, chunked.head.bias).float()
    model.reshard()
    agree, difference = _probe_agrees(remade, plain, facts.param_dtype)
    if agree:
        return True
    logger.warning(
        "actor.fsdp.lm_head_chunk_tokens is ignored for %s: its logits are not its output embedding of the "
        "last hidden states (%.3g apart: soft-capping or a logit scale?); the full logits are used",
        hf_class.__name__,
        difference,
    )
    return False


@torch.no_grad()
def packing_works(model: torch.nn.Module, forward: ModelForward, facts: BuildFacts, hf_class: type) -> bool:
    """Whether this model keeps packed sequences apart: two probe sequences run packed and padded must
    give the same outputs. Models whose attention ignores restarting position ids would let
    packed sequences attend to each other silently; those run padded, with a warning."""
    lengths = (5, 3, 2)  # packed: [5] and [3, 2]: the 2-token sequence shares a row with the 3-token one
    width = max(lengths)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths], device=facts.device)
    ids = torch.arange(len(lengths) * width, device=facts.device).view(mask.shape) * 7 % facts.vocab_size
    probe = Batch(
        {
            "input_ids": ids * mask,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        }
    )
    model.eval()
    padded = forward(probe, packed=False, chunk=None).logits.float()
    packed = forward(probe, packed=True, chunk=None)
    unpacked = packed.packing.unpack(packed.logits.float())
    model.reshard()  # the sharded root parameters again: the optimizer is built from them next
    real = mask.bool()
    agree, difference = _probe_agrees(unpacked[real], padded[real], facts.param_dtype)
    if agree:
        return True
    logger.warning(
        "sequence packing is off for %s: packed sequences gave outputs %.3g away from padded ones (its "
        "attention does not separate sequences by position ids); set actor.sequence_packing=false to "
        "silence this",
        hf_class.__name__,
        difference,
    )
    return False


def _probe_agrees(actual: Tensor, expected: Tensor, param_dtype: torch.dtype) -> tuple[bool, float]:
    """(whether a start-up probe's two outputs agree up to the engine's dtype, their largest difference)."""
    difference = float((actual - expected).abs().max())
    tolerance = 1e-4 if param_dtype == torch.float32 else 5e-2
    return difference <= tolerance * max(1.0, float(expected.abs().max())), difference


def _keep_parameters_in(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """The model's floating-point parameters (not its buffers) cast to `dtype`, in place, before sharding: the
    sharded weights, their gradients and AdamW's state are then kept in it (actor.fsdp.model_dtype). Rank 0's full
    state, taken before, is copied in at that dtype when the model is filled."""
    for param in model.parameters():
        if param.is_floating_point():
            param.data = param.data.to(dtype)


def _move_buffers(model: torch.nn.Module, device: torch.device) -> None:
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer.device != device:
                module._buffers[name] = buffer.to(device)
