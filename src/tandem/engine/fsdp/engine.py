"""`FSDPEngine`: a transformers model sharded with FSDP2 (`fully_shard`) over the default process group.

Data parallel over every rank of the default group (dp_rank = rank, dp_size = world size), or with
`fsdp.sequence_parallel = k` over world / k groups of k ranks that split each row (Ulysses,
engine/fsdp/ulysses.py): dp_rank = rank // k. Parameters are sharded over every rank either way.
Construction: rank 0 reads the Hugging Face folder into float32 CPU weights, the other ranks
build the same model on the meta device; every decoder layer and then the root are
`fully_shard`-ed and the full state dict is broadcast from rank 0 into the shards. Buffers
(which FSDP does not shard) are broadcast from rank 0 as well: that is what gives the ranks
that started on the meta device their rotary `inv_freq` (non-persistent, so in no state dict).

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
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import Tensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard
from torch.nn.utils import clip_grads_with_norm_, get_total_norm

from tandem.batch import Batch, Partition
from tandem.config.schema import FSDPConfig, OptimConfig
from tandem.data.packing import pack_model_inputs
from tandem.engine import hf_io, moe
from tandem.engine.base import (
    DTYPES,
    ForwardFn,
    Head,
    LossFn,
    ModelOutput,
    StepResult,
    TrainEngine,
    check_engine_args,
    load_engine_state,
    pad_micro_batch,
    resolve_param_dtype,
    save_engine_state,
)
from tandem.engine.fsdp import lora as lora_layers
from tandem.engine.fsdp import reshard
from tandem.engine.fsdp.ulysses import (
    check_heads,
    scale_grad,
    sequence_parallel_groups,
    sp_attention,
    sp_forward,
)
from tandem.engine.fsdp.vision import VisionTower
from tandem.engine.lm_head import ChunkedHead, chunk_tokens, hidden_states_out
from tandem.engine.micro import dummy_like, merge_outputs, real_token_count, split_micro_batches, to_cpu
from tandem.engine.optim import build_optimizer, build_scheduler
from tandem.models.model_type import is_vision_language
from tandem.models.tp_cuts import Cut

logger = logging.getLogger(__name__)

ADAPTER_FOLDER = "lora_adapter"  # an export's PEFT adapter folder, inside the merged model's folder
VALUE_HEAD = ("score",)  # a value model's head (transformers' token classifiers): trained whole under LoRA
_warned_cpu_offload = False


class FSDPEngine(TrainEngine):
    """One Hugging Face model (+ AdamW when `optim` is given) sharded with FSDP2.

    Master weights, gradients and optimizer state are float32; forward / backward run in the
    resolved `fsdp.param_dtype`. `optim=None` builds a frozen engine (reference model): forward only.

    model_path: a local Hugging Face folder. head: "lm" (causal LM) or "value" (a 1-label token
    classifier; its `score` is initialised from `seed` when the folder has none).
    total_training_steps: needed by cosine / linear decay and by warmup_ratio.
    activation_checkpointing: recompute each decoder layer in backward (same numbers, less memory).
    packing: run micro-batches as packed sequences (no padding computed).
    max_tokens_per_micro_batch: cut micro-batches by this token budget instead of `micro_batch_size`.
    """

    def __init__(
        self,
        *,
        model_path: str | Path,
        head: Head,
        device: torch.device | str,
        optim: OptimConfig | None,
        fsdp: FSDPConfig,
        grad_clip: float | None,
        total_training_steps: int | None,
        activation_checkpointing: bool = False,
        seed: int = 1,
        packing: bool = False,
        max_tokens_per_micro_batch: int | None = None,
        router_aux_loss_coef: float | None = None,
        lora: Any = None,
    ) -> None:
        check_engine_args("FSDPEngine", grad_clip, max_tokens_per_micro_batch)
        # actor.lora / critic.lora with rank > 0: low-rank adapters trained, every other weight frozen but a value
        # model's head (engine/fsdp/lora.py)
        self.lora = lora if lora is not None and lora.rank > 0 else None
        self.packing = packing
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.model_path = str(model_path)
        self.head = head
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        # Ulysses sequence parallel (engine/fsdp/ulysses.py): None, or this rank's group of ranks splitting each row
        self.sp, self._dp_group = sequence_parallel_groups(fsdp, self.device, self.world_size)
        sp_size = self.sp.size if self.sp else 1
        self.dp_rank = self.rank // sp_size
        self.dp_size = self.world_size // sp_size
        self.grad_clip = grad_clip
        self.global_step = 0  # optimizer steps taken (or skipped); for logs and checkpoints
        self._offloaded: list[tuple[dict, str]] = []  # optimizer-state entries moved by offload()
        self._is_offloaded = False
        self.param_dtype = resolve_param_dtype(fsdp.param_dtype, self.device)
        if (
            fsdp.param_dtype == "auto"
            and self.device.type == "cpu"
            and self._max_over_ranks(int(self.param_dtype != torch.bfloat16))
        ):
            self.param_dtype = torch.float32  # a CPU probe's choice, made per rank: bf16 only if all chose it

        attention = hf_io.attention_implementation(fsdp.attn_implementation, self.device)
        if self.sp is not None:
            attention = sp_attention(fsdp, attention)
        config = hf_io.load_config(self.model_path, head, attention)
        if self.sp is not None:
            check_heads(config, self.sp.size)
        self._export_config = config.to_dict()  # as the user wrote it (dropout included), for export_hf
        hf_io.disable_dropout(config)
        config.use_cache = False
        self.config = config
        self.vocab_size = (
            config.get_text_config().vocab_size
        )  # a vision-language config keeps it in its text part
        # A mixture-of-experts causal LM: its routers' load-balancing loss joins every training pass (engine/moe.py)
        self.routing = moe.routing_of(config, router_aux_loss_coef) if head == "lm" else None
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
        offload = self._offload_policy(fsdp.cpu_offload)
        self._cpu_offload = offload is not None
        self.model, self._hf_class, state_keys = self._build_model(
            fsdp, offload, activation_checkpointing, seed
        )
        self._state_keys = set(state_keys)  # the HF state_dict's names: what state_dict_iter yields
        # image inputs, and the vision tower on every rank in every forward (engine/fsdp/vision.py)
        self._vision = VisionTower(self.model) if vision_language else None
        if self.packing:
            self.packing = self._packing_works()
        # fsdp.lm_head_chunk_tokens: the LM head a chunk at a time from the hidden states (engine/lm_head.py)
        self.lm_head_chunk = (
            chunk_tokens(fsdp.lm_head_chunk_tokens, self.vocab_size) if head == "lm" else None
        )
        if self.lm_head_chunk is not None and not self._chunked_head_works():
            self.lm_head_chunk = None

        self.optimizer = None
        self.scheduler = None
        if optim is not None:
            # the trained weights only: all of them, or the adapters under actor.lora
            self.optimizer = build_optimizer([p for p in self.model.parameters() if p.requires_grad], optim)
            self.scheduler = build_scheduler(self.optimizer, optim, total_training_steps)
        self.compile_seconds = self._compile_layers() if fsdp.torch_compile else None

    # ------------------------------------------------------------------ construction
    def _build_model(
        self, fsdp: FSDPConfig, offload: CPUOffloadPolicy | None, activation_checkpointing: bool, seed: int
    ) -> tuple[torch.nn.Module, type, list[str]]:
        is_source = self.rank == 0
        if is_source:
            model = hf_io.load_pretrained(self.model_path, self.config, self.head, seed)
            full_state = model.state_dict()  # references; survive the sharding below
        else:
            model = hf_io.build_on_meta(self.config, self.head)
            full_state = {}
        hf_class = type(model)  # fully_shard swaps in a subclass; export writes the original
        if self.lora is not None:  # adapters in place, before the state is taken and the layers are sharded
            lora_layers.inject(model, self.lora, seed, whole=VALUE_HEAD if self.head == "value" else ())
            if is_source:
                full_state = model.state_dict()
        state_keys = hf_io.persistent_keys(model)
        if activation_checkpointing:
            hf_io.enable_activation_checkpointing(model)

        mp_policy = MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=DTYPES[fsdp.reduce_dtype])
        shard_kwargs: dict[str, Any] = {
            "mesh": init_device_mesh(self.device.type, (self.world_size,)),  # sharded over every rank
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
            model.to_empty(device="cpu" if offload is not None else self.device)
            _move_buffers(model, self.device)
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

    def _compile_layers(self) -> float:
        """`fsdp.torch_compile`: each decoder layer compiled in place (`Module.compile`, so the parameter names
        stay the HF ones and FSDP2's hooks stay on the layers), with dynamic shapes: packed rows are one
        [1, tokens] row whose length changes every micro-batch. Compiling happens on a layer's first calls
        with a new grad mode / train flag; a warm-up pays it here (a training pass with its backward, and a
        no-grad pass), timed and logged, so no step's time holds it. Returns the warm-up's seconds.

        Sizes 0 and 1 are never dynamic in torch.compile: padded micro-batches warm up with 2 rows and with 1,
        and the engine's dummy passes are 2 tokens long. A shape the warm-up did not foresee compiles on first
        use (torch recompiles by itself, up to its recompile limit)."""
        layers = hf_io.decoder_layers(self.model)
        if not layers:
            raise ValueError(
                f"fsdp.torch_compile=true: no decoder layers found in {self._hf_class.__name__} to compile; "
                "set fsdp.torch_compile=false"
            )
        for layer in layers:
            layer.compile(dynamic=True)
        start = time.perf_counter()
        # two sequences: one packed [1, 11] row, or a padded [2, 7] batch (its first row padded)
        lengths = (4, 7)
        mask = torch.tensor([[1] * n + [0] * (max(lengths) - n) for n in lengths], device=self.device)
        ids = (torch.arange(mask.numel(), device=self.device).view(mask.shape) * 3 + 1) % self.vocab_size
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        warm = Batch({"input_ids": ids * mask, "attention_mask": mask, "position_ids": positions})
        # Packed micro-batches are always one row; padded ones are 1 row or more, two graphs.
        shapes = [warm] if self.packing else [warm, warm.slice(0, 1)]
        for micro in shapes:
            if self.optimizer is not None:
                self.model.train()
                self._model_forward(micro).zero_loss().backward()
                for param in self.model.parameters():
                    param.grad = None
            self.model.eval()
            with torch.no_grad():
                self._model_forward(micro)
        self.model.reshard()
        seconds = time.perf_counter() - start
        logger.info(
            "fsdp.torch_compile: %d decoder layers of %s compiled in %.1f s (warm-up, %s)",
            len(layers),
            self._hf_class.__name__,
            seconds,
            "training and no-grad passes" if self.optimizer is not None else "no-grad pass",
        )
        return seconds

    def _offload_policy(self, cpu_offload: bool) -> CPUOffloadPolicy | None:
        global _warned_cpu_offload
        if not cpu_offload:
            return None
        if self.device.type != "cuda":
            if not _warned_cpu_offload:
                logger.info("fsdp.cpu_offload on device %s: nothing to offload, ignored", self.device)
                _warned_cpu_offload = True
            return None
        return CPUOffloadPolicy()

    # ------------------------------------------------------------------ forward
    def forward(self, batch: Batch, fn: ForwardFn, micro_batch_size: int) -> Batch:
        """`fn(output, micro)` per micro-batch under no_grad; its per-row tensors concatenated on the CPU.

        A rank with no rows still runs `fn` once on a dummy row (zeros in the batch's shapes) and
        returns 0 rows of its outputs, so an empty shard has the same keys as the others. When
        every rank is empty, the result is an empty Batch with no keys."""
        self._check_onloaded("forward")
        micros, plan = self._micro_batches(batch, micro_batch_size)
        num_passes = self._max_over_ranks(len(micros))
        self.model.eval()
        parts: list[dict[str, Tensor]] = []
        with torch.no_grad():
            for i in range(num_passes):
                if i < len(micros):
                    micro = micros[i].to(self.device)
                    parts.append(to_cpu(fn(self._model_forward(micro), micro)))
                elif not micros and i == 0:
                    # An empty shard: run fn on a dummy row of the batch's shapes, keep 0 rows of it.
                    micro = dummy_like(batch).to(self.device)
                    parts.append({k: v[:0] for k, v in to_cpu(fn(self._model_forward(micro), micro)).items()})
                else:
                    self._model_forward(pad_micro_batch(self._pad_id(), self.device, tokens=2))
        # FSDP2 keeps the root's parameters unsharded after a forward until the next backward: register the
        # sharded ones again, or a save (or an optimizer built now) would see other tensors than the optimizer's.
        self.model.reshard()
        return merge_outputs(parts, plan)

    # ------------------------------------------------------------------ training
    def train_step(self, batch: Batch, loss_fn: LossFn, micro_batch_size: int) -> StepResult:
        if self.optimizer is None:
            raise RuntimeError(
                "train_step on a frozen engine (built with optim=None); give it an OptimConfig"
            )
        self._check_onloaded("train_step")
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
                output = self._model_forward(micro, router=self.routing is not None)
                loss, micro_metrics = loss_fn(output, micro)
                if output.router_balance is not None:  # this micro-batch's token share of the balance term
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

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else 0.0

    # ------------------------------------------------------------------ collectives
    def all_reduce_sum(self, value: Tensor) -> Tensor:
        reduced = value.detach().to(self.device, copy=True)
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM, group=self._dp_group)
        return reduced.to(value.device)

    def dispatch_info(self) -> tuple[int, int, bool]:
        """The ranks of a sequence-parallel group share one data-parallel index; its first answers."""
        return self.dp_rank, self.dp_size, self.sp is None or self.sp.rank == 0

    def _step_tokens(self, micros: list[Batch]) -> float:
        """Real tokens of this step's micro-batches on all data-parallel ranks (at least 1)."""
        local = torch.tensor(float(sum(real_token_count(m) for m in micros)), dtype=torch.float64)
        return max(float(self.all_reduce_sum(local)), 1.0)

    def _max_over_ranks(self, count: int) -> int:
        value = torch.tensor(count, dtype=torch.int64, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value)

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

    def _model_forward(
        self, micro: Batch, packed: bool | None = None, chunk: int | None = -1, router: bool = False
    ) -> ModelOutput:
        """The model on one micro-batch, packed (default: as the engine is set) or padded; its logits, or with
        a head chunk (default: as the engine is set) its last hidden states and the head that makes logits.
        `router`: also the routers' load-balancing term of a mixture-of-experts model (engine/moe.py)."""
        ids = micro["input_ids"]
        chunk = self.lm_head_chunk if chunk == -1 else chunk
        packing = None
        pack = (self.packing if packed is None else packed) and "attention_mask" in micro
        if self._vision is not None:
            inputs, packing = self._vision.model_inputs(micro, self.device, self._pad_id() if pack else None)
        elif pack:
            # No attention mask: transformers separates the sequences by their restarting position ids.
            inputs, packing = pack_model_inputs(ids, micro["attention_mask"], self._pad_id())
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
        if chunk is None:
            logits = run(inputs)
        else:
            with hidden_states_out(self.model) as out_embedding:
                logits = run(inputs)
        if routers is not None:
            tokens = moe.real_tokens(inputs.get("attention_mask"), tuple(inputs["input_ids"].shape), packing)
            balance = moe.balance_loss(routers, tokens.to(self.device), self.routing)
        if chunk is None:
            return ModelOutput(logits, tuple(ids.shape), packing, router_balance=balance)
        # FSDP2 leaves the root's parameters (the head's among them) unsharded after a forward.
        weight, bias = out_embedding.weight, out_embedding.bias
        if self.sp is not None:  # every rank of the group applies the head to all tokens: count it once
            weight, bias = scale_grad(weight, 1 / self.sp.size), scale_grad(bias, 1 / self.sp.size)
        head = ChunkedHead(weight, bias, chunk)
        return ModelOutput(logits, tuple(ids.shape), packing, head=head, router_balance=balance)

    def _model(self, inputs: dict[str, Tensor], routers: list[Tensor] | None = None) -> Tensor:
        """The model's logits; with `routers`, its router logits (one [tokens, E] per MoE layer) appended there."""
        if routers is None:
            return self.model(**inputs, use_cache=False).logits
        output = self.model(**inputs, use_cache=False, output_router_logits=True)
        routers.extend(output.router_logits)
        return output.logits

    @torch.no_grad()
    def _chunked_head_works(self) -> bool:
        """Whether this model's logits are exactly its output embedding of the last hidden states (no
        soft-capping or scaling after it): a probe's logits both ways. Otherwise the plain head, warned."""
        ids = torch.arange(6, device=self.device).view(1, 6) * 5 % self.vocab_size
        positions = torch.arange(6, device=self.device).view(1, 6)
        probe = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": positions})
        self.model.eval()
        plain = self._model_forward(probe, packed=False, chunk=None).logits.float()
        chunked = self._model_forward(probe, packed=False, chunk=self.lm_head_chunk)
        remade = F.linear(chunked.logits, chunked.head.weight, chunked.head.bias).float()
        self.model.reshard()
        agree, difference = self._probe_agrees(remade, plain)
        if agree:
            return True
        logger.warning(
            "actor.fsdp.lm_head_chunk_tokens is ignored for %s: its logits are not its output embedding of the "
            "last hidden states (%.3g apart: soft-capping or a logit scale?); the full logits are used",
            self._hf_class.__name__,
            difference,
        )
        return False

    @torch.no_grad()
    def _packing_works(self) -> bool:
        """Whether this model keeps packed sequences apart: two probe sequences run packed and padded must
        give the same outputs. Models whose attention ignores restarting position ids would let
        packed sequences attend to each other silently; those run padded, with a warning."""
        lengths = (5, 3, 2)  # packed: [5] and [3, 2]: the 2-token sequence shares a row with the 3-token one
        width = max(lengths)
        mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths], device=self.device)
        ids = torch.arange(len(lengths) * width, device=self.device).view(mask.shape) * 7 % self.vocab_size
        probe = Batch(
            {
                "input_ids": ids * mask,
                "attention_mask": mask,
                "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            }
        )
        self.model.eval()
        padded = self._model_forward(probe, packed=False, chunk=None).logits.float()
        packed = self._model_forward(probe, packed=True, chunk=None)
        unpacked = packed.packing.unpack(packed.logits.float())
        self.model.reshard()  # the sharded root parameters again: the optimizer is built from them next
        real = mask.bool()
        agree, difference = self._probe_agrees(unpacked[real], padded[real])
        if agree:
            return True
        logger.warning(
            "sequence packing is off for %s: packed sequences gave outputs %.3g away from padded ones (its "
            "attention does not separate sequences by position ids); set actor.sequence_packing=false to "
            "silence this",
            self._hf_class.__name__,
            difference,
        )
        return False

    def _probe_agrees(self, actual: Tensor, expected: Tensor) -> tuple[bool, float]:
        """(whether a start-up probe's two outputs agree up to this engine's dtype, their largest difference)."""
        difference = float((actual - expected).abs().max())
        tolerance = 1e-4 if self.param_dtype == torch.float32 else 5e-2
        return difference <= tolerance * max(1.0, float(expected.abs().max())), difference

    def _pad_id(self) -> int:
        # a vision-language config keeps it in its text part
        pad = getattr(self.config.get_text_config(), "pad_token_id", None)
        return pad if pad is not None else 0

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def state_dict_iter(self) -> Iterator[tuple[str, Tensor]]:
        """(HF name, full float32 tensor on the engine's device), one tensor gathered at a time.

        Names are those of the HF model's `state_dict()` minus tied duplicates (the tied
        `lm_head.weight` is left out: it is `model.embed_tokens.weight`). Collective: every rank
        must iterate to the end; each rank receives every full tensor."""
        if self.lora is None:
            for name, tensor in self._named_state():
                yield name, self._full(tensor)
        else:  # the plain model's names, each adapter folded into its weight
            yield from lora_layers.merged_weights(self._named_state(), self.model, self._full)

    @torch.no_grad()
    def state_dict_cuts(
        self, cuts_of: Callable[[str, tuple[int, ...]], list[Cut | None]]
    ) -> Iterator[tuple[str, Tensor, Cut | None, torch.Size]]:
        """(HF name, this rank's cut of the tensor, the cut, the whole tensor's shape), one tensor at a time.
        `cuts_of(name, shape)`: every rank's cut of that tensor (None: whole), as a tensor-parallel rollout
        engine over consecutive ranks keeps them (models/tp_cuts.py). Each rank
        receives its cut alone (engine/fsdp/reshard.py: one all-to-all from the FSDP2 row shards); a tensor no
        rank cuts is gathered whole. Collective, like `state_dict_iter`; not with LoRA adapters."""
        if self.lora is not None:
            raise RuntimeError(
                "state_dict_cuts: LoRA adapters are merged from whole tensors (state_dict_iter)"
            )
        for name, tensor in self._named_state():
            every = cuts_of(name, tuple(tensor.shape))
            mine = every[self.rank]
            if not isinstance(tensor, DTensor):
                piece = (
                    tensor.detach()
                    if mine is None
                    else tensor.detach().narrow(mine.dim, mine.start, mine.length)
                )
            elif all(cut is None for cut in every):
                piece = self._full(tensor)
            else:
                if tensor.placements != (Shard(0),):
                    raise RuntimeError(
                        f"state_dict_cuts: {name} is laid out {tensor.placements}, not FSDP2's Shard(0)"
                    )
                piece = reshard.gather_cut(
                    tensor.to_local().to(self.device), tensor.shape, every, tensor.device_mesh.get_group()
                )
            yield name, piece, mine, tensor.shape

    def _named_state(self) -> Iterator[tuple[str, Tensor]]:
        """The parameters (tied duplicates once) and persistent buffers, the checkpoint's tensors."""
        params = self.model.named_parameters()  # drops tied duplicates
        # non-persistent buffers (rotary inv_freq) are not part of a checkpoint
        return ((n, t) for n, t in chain(params, self.model.named_buffers()) if n in self._state_keys)

    @torch.no_grad()
    def adapter_state(self) -> dict[str, Tensor]:
        """actor.lora's adapters, full, under the names of a PEFT adapter file (collective: every rank calls and
        receives them all)."""
        if self.lora is None:
            raise RuntimeError("adapter_state: this engine trains no LoRA adapters (actor.lora.rank=0)")
        return lora_layers.adapter_state(self.model.named_parameters(), self._full)

    def vision_adapters(self) -> list[str]:
        """The LoRA layers inside a vision-language model's vision tower (none for a text model)."""
        if self._vision is None or self.lora is None:
            return []
        tower = {id(module) for module in self._vision.visual.modules()}
        return [name for name, layer in lora_layers.lora_layers(self.model).items() if id(layer) in tower]

    def _full(self, tensor: Tensor) -> Tensor:
        """A full local tensor of a parameter or buffer (a collective for a sharded one)."""
        if isinstance(tensor, DTensor):
            if tensor.device != self.device:  # CPU-offloaded shards: gather on the compute device
                tensor = tensor.to(self.device)
            tensor = tensor.full_tensor()
        return tensor.detach()

    def export_hf(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        """A Hugging Face folder in `path` (rank 0 writes; every rank must call).

        Weights are written in `dtype`, by default the dtype the source folder declares, with
        the source's config (dropout as the user had it) and its tokenizer / generation files.
        A "value" engine writes a token-classification model with one label."""
        dtype = dtype or hf_io.export_dtype(self.config)
        state: dict[str, Tensor] = {}
        for name, tensor in self.state_dict_iter():
            if self.rank == 0:
                state[name] = tensor.to("cpu", dtype=dtype if tensor.is_floating_point() else tensor.dtype)
        if self.rank == 0:
            config = type(self.config).from_dict(self._export_config)
            hf_io.save_folder(self._hf_class, config, state, path, dtype=dtype, source_path=self.model_path)
        if self.lora is not None and self.head == "lm":  # and the adapters alone, as PEFT saves them, inside
            adapters = self.adapter_state()
            if self.rank == 0:
                lora_layers.save_adapter(Path(path) / ADAPTER_FOLDER, self.lora, adapters, self.model_path)
        dist.barrier()

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | Path) -> None:
        path = Path(path)
        dcp.save(self._checkpoint_state(), checkpoint_id=path)
        if self.rank == 0:
            extra = {"global_step": self.global_step}
            if self.scheduler is not None:
                extra["scheduler"] = self.scheduler.state_dict()
            save_engine_state(path, extra)
        dist.barrier()

    def load(self, path: str | Path, weights_only: bool = False) -> None:
        path = Path(path)
        extra = load_engine_state(path)
        state = self._checkpoint_state(weights_only)
        if "optim" in state and not _holds_optimizer_state(path):
            raise ValueError(
                f"{path} holds no optimizer state (saved by a frozen engine); load its weights alone "
                "(weights_only=True) or resume from a checkpoint of a trained engine"
            )
        dcp.load(state, checkpoint_id=path)
        options = self._state_options()
        if "optim" not in state:
            set_model_state_dict(self.model, state["model"], options=options)
        else:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
                options=options,
            )
        if weights_only:  # the weights alone: the step and the schedule stay this engine's
            return
        self.global_step = int(extra["global_step"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(extra["scheduler"])

    def _state_options(self) -> StateDictOptions:
        """With LoRA a checkpoint holds what trains (the adapters; a value model's head too) and its optimizer
        state: the frozen weights are the model folder's, which every engine is built from, so they are
        neither written nor read (strict=False: the state names only what trains)."""
        adapters_only = self.lora is not None
        return StateDictOptions(ignore_frozen_params=adapters_only, strict=not adapters_only)

    def _checkpoint_state(self, weights_only: bool = False) -> dict[str, Any]:
        options = self._state_options()
        if self.optimizer is None or weights_only:
            return {"model": get_model_state_dict(self.model, options=options)}
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=options)
        return {"model": model_state, "optim": optim_state}

    # ------------------------------------------------------------------ memory
    def offload(self) -> None:
        """Parameters, gradients and optimizer state to host memory; a no-op on the CPU and under
        fsdp.cpu_offload (they live there already). forward / train_step refuse until `onload`."""
        if self.device.type != "cuda" or self._cpu_offload or self._is_offloaded:
            return
        cpu = torch.device("cpu")
        # FSDP2 re-points its sharded parameters (and their gradients) after `.to()`.
        self.model.to(cpu)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    # Only what is on the GPU: AdamW keeps its `step` counters on the CPU on purpose.
                    if isinstance(value, Tensor) and value.device.type == "cuda":
                        state[key] = value.to(cpu, non_blocking=True)
                        self._offloaded.append((state, key))
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        self._is_offloaded = True

    def onload(self) -> None:
        if not self._is_offloaded:
            return
        self.model.to(self.device)
        for state, key in self._offloaded:
            state[key] = state[key].to(self.device, non_blocking=True)
        self._offloaded = []
        torch.cuda.synchronize(self.device)
        self._is_offloaded = False


def _move_buffers(model: torch.nn.Module, device: torch.device) -> None:
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer.device != device:
                module._buffers[name] = buffer.to(device)


def _holds_optimizer_state(path: Path) -> bool:
    """Whether a torch.distributed.checkpoint folder holds an optimizer's state (keys under "optim")."""
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    return any(key.startswith("optim") for key in metadata.state_dict_metadata)
