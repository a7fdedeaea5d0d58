"""The engine sections of Tandem's configuration (schema.py holds the rest and re-exports these): the
optimizer and its schedule, FSDP2's and megatron-core's settings, and LoRA. Units and conventions are
schema.py's (its docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Dtype = Literal["float32", "bfloat16", "float16"]
LoraInit = Literal["auto", "kaiming", "xavier"]
ParamDtype = Literal["auto", "float32", "bfloat16", "float16"]
MasterDtype = Literal["float32", "bfloat16"]  # actor.fsdp.model_dtype
AdamImpl = Literal["fused", "foreach", "for_loop"]
LrScheduler = Literal["constant", "cosine", "linear"]
LoraSync = Literal["merged", "adapter"]


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule. The schedule advances once per TRAINING STEP."""

    lr: float = 1e-6  # peak learning rate, > 0
    weight_decay: float = 0.01  # decoupled weight decay (AdamW), >= 0
    betas: tuple[float, float] = (0.9, 0.999)  # Adam moment decay rates, each in [0, 1)
    eps: float = 1e-8  # Adam denominator epsilon, > 0
    lr_scheduler: LrScheduler = "constant"  # shape after warm-up: constant, cosine or linear decay
    warmup_steps: int = 0  # TRAINING STEPS of linear warm-up from 0; when > 0 it wins over warmup_ratio
    warmup_ratio: float = 0.0  # in [0, 1): fraction of all training steps that warm up (if warmup_steps=0)
    min_lr_ratio: float = 0.0  # in [0, 1]: cosine / linear decay ends at lr * this
    # torch's AdamW kernels: fused (one kernel per step; fastest measured, CPU and GPU), foreach, for_loop
    implementation: AdamImpl = "fused"


@dataclass
class FSDPConfig:
    """FSDP2 (`fully_shard`) settings, used when actor.strategy=fsdp.

    Data-parallel size = world size / sequence_parallel (see cfg.derived.dp_size)."""

    # forward / backward dtype (master weights, optimizer state and reductions: float32); the rollout engine's
    # too. auto = bfloat16 on cuda; on a cpu, bfloat16 only where its bf16 matmuls are clearly faster (native
    # AMX / AVX-512 BF16, measured at start-up: engine/auto_dtype.py), else float32
    param_dtype: ParamDtype = "auto"
    reduce_dtype: Dtype = "float32"  # dtype of the gradient reduce-scatter across ranks
    # dtype the weights (and so AdamW's state) are kept in between steps: float32 master weights, or bfloat16 as
    # verl's fsdp_config.model_dtype=bf16 keeps them (half the memory of weights + optimizer; each update is then
    # rounded to bf16, so updates much smaller than a weight's bf16 spacing are lost)
    model_dtype: MasterDtype = "float32"
    cpu_offload: bool = False  # keep sharded parameters, gradients and optimizer state in CPU memory
    sequence_parallel: int = 1  # RANKS splitting each sequence (Ulysses); divides the world size
    # TOKENS per chunk of the LM head (actor, reference, SFT): log-probs and entropy made from the hidden
    # states a chunk at a time, never the [tokens, vocab] logits (engine/lm_head.py); null = the model's full
    # logits; auto = chunks of about 32 M logits (2^25 / vocab tokens; 128 M on CUDA, where the matmuls need
    # more rows to not be bound by reading the head's weight) for a vocabulary of >= 32768, else null
    lm_head_chunk_tokens: int | Literal["auto"] | None = "auto"
    # each head chunk's float32 arithmetic (logsumexp, log-probs, entropy; in backward the gradient) compiled
    # with torch.compile into a kernel or two that read the chunk's logits, instead of a dozen eager passes over
    # [chunk, vocab] (engine/lm_head.py; verl's use_torch_compile). Compiled and warmed up at start-up. auto = on
    # CUDA, and on a CPU for a vocabulary of >= 32768 where a C++ compiler is found (inductor needs one there);
    # under auto a compile that fails is a warning and the head runs eager. Only a chunked head compiles
    lm_head_compile: bool | Literal["auto"] = "auto"
    # fused RMSNorm, RoPE and SwiGLU kernels from the liger-kernel package (CUDA; verl's use_liger): the
    # decoder layers' elementwise work in fewer passes; parameter names unchanged (engine/kernels.py)
    liger: bool = False
    # compile each decoder layer with torch.compile (dynamic shapes, inductor): the norms, rotary embedding, SiLU
    # and residual adds fused into a few kernels. The compile is paid at start-up, in a warm-up timed and logged
    # (timing_s/compile); the steps run the compiled code. auto = on CUDA without sequence_parallel (1.14x on
    # a 0.5 B update on an H200), off on a CPU (0.78x-0.99x there, bench/README.md); under
    # auto a warm-up that fails is a warning and the layers run eager
    torch_compile: bool | Literal["auto"] = "auto"
    # attention kernel of the trained models (engine/attention.py). Packed sequences run as one row, each
    # attending only inside itself, with flash_attention_2 (CUDA + the flash-attn package), varlen (CUDA,
    # torch's own flash kernel), flex_attention (torch's, document block mask; trains on CUDA only) or
    # sdpa_split (sdpa a sequence at a time, any device); sdpa and eager mask each row's width^2 scores.
    # auto: on CUDA the first of flash_attention_2, varlen, flex_attention that runs; on the CPU sdpa
    attn_implementation: Literal[
        "auto", "sdpa", "eager", "flash_attention_2", "varlen", "flex_attention", "sdpa_split"
    ] = "auto"


@dataclass
class MegatronConfig:
    """megatron-core model parallelism, used when actor.strategy=megatron. Sizes count RANKS, each >= 1.

    tensor x pipeline x context must divide the world size; the batch is split over the rest
    (data-parallel size = world / (tensor x pipeline x context), see cfg.derived.dp_size)."""

    tensor_parallel: int = 1  # ranks splitting each layer's weight matrices
    pipeline_parallel: int = 1  # ranks splitting the stack of layers
    # model chunks per pipeline rank (virtual stages, megatron's interleaved schedule: a smaller pipeline bubble
    # for more point-to-point sends); > 1 needs pipeline_parallel > 1 and layers divisible by pipeline x this
    virtual_pipeline: int = 1
    context_parallel: int = 1  # ranks splitting each sequence
    expert_parallel: int = 1  # ranks splitting the experts of MoE layers; divides world / (tensor x pipeline)
    # with tensor_parallel > 1: the activations outside the matmuls (norms, residuals) split over the tensor-
    # parallel ranks along the sequence, all-gathered / reduce-scattered around each block (megatron's sequence
    # parallel): less activation memory, the same numbers; ignored at tensor_parallel = 1
    sequence_parallel: bool = False
    param_dtype: ParamDtype = (
        "auto"  # compute dtype; auto: bfloat16 on CUDA (float32 master weights), float32 on CPU
    )
    distributed_optimizer: bool = True  # shard optimizer state over data-parallel ranks (CUDA only)
    # fields of megatron-core's TransformerConfig, passed through (e.g. recompute_granularity: selective,
    # recompute_method: block, recompute_num_layers: 2); keys Tandem sets itself are refused, CUDA-only
    # kernels are off on a CPU (config/megatron_overrides.py)
    override_transformer_config: dict[str, Any] = field(default_factory=dict)
    # fields of megatron-core's OptimizerConfig, passed through likewise (e.g. optimizer_cpu_offload on CUDA)
    override_optimizer_config: dict[str, Any] = field(default_factory=dict)
    param_offload: bool = False  # the actor's and critic's parameters in host memory between calls
    grad_offload: bool = False  # their gradient buffers freed between updates, back zeroed for the next
    optimizer_offload: bool = False  # their optimizer state (master weights, Adam moments) in host memory
    # the actor's (and the reference's) starting weights: a megatron distributed checkpoint folder (verl's
    # dist_checkpointing_path; `tandem convert hf-to-mcore` writes one, a Tandem checkpoint's actor/ is one)
    # instead of actor.model_path's weights; model_path still gives the architecture and the tokenizer. Every
    # weight of the model must be in it with the model's shape (engine/megatron/dist_start.py)
    dist_checkpoint: str | None = None


@dataclass
class LoraConfig:
    """Low-rank adapters (FSDP2, PEFT): only the adapters train (and a critic's value head, whole). On the
    actor, the reference policy is the actor with its adapters off (no second model)."""

    rank: int = 0  # r, >= 0; 0 = off (every weight trains)
    alpha: float = 16.0  # > 0: the adapters' output is scaled by alpha / rank
    dropout: float = 0.0  # in [0, 1): dropout on the adapters' input
    # PEFT's target_modules: module names (e.g. [q_proj, v_proj]) or [all-linear] (every linear but the head)
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    # modules that get no adapter though target_modules names them, nor does anything inside them: each entry a
    # module's name, the end of its dotted name (visual, lm_head) or a regular expression over the whole name
    # (.*visual.*); an entry that names no module of the model is an error (engine/fsdp/lora.py)
    exclude_modules: list[str] = field(default_factory=list)
    # how each adapter's A is drawn (B starts at 0): kaiming (kaiming-uniform, a = sqrt(5): PEFT's, verl's FSDP
    # LoRA), xavier (xavier-uniform: megatron-bridge's, verl's megatron default); auto: the engine's verl
    # default (train_engine_options.py: xavier on megatron, kaiming on fsdp). An adapter folder keeps its own A
    init_a: LoraInit = "auto"


@dataclass
class ActorLoraConfig(LoraConfig):
    """The actor's adapters, and what its rollout engine gets of them."""

    # what the rollout gets after each update: merged = every weight with the adapters folded in (the plain
    # model, served at full speed); adapter = the adapters alone, served by vLLM's LoRA support on the base
    # weights it loaded at start (a sync of megabytes; generation computes the adapters' extra matmuls)
    rollout_sync: LoraSync = "merged"
    # a PEFT adapter folder (adapter_config.json, adapter_model.safetensors) the adapters start from, instead
    # of new ones (A random, B = 0); LoRA is on with it. Its config says rank, alpha, dropout, target_modules and
    # exclude_modules: the keys above, left at their defaults, are filled from it; set to another value, refused
    adapter_path: str | None = None

    @property
    def syncs_adapters(self) -> bool:
        """Adapters on, and the rollout served them alone (rollout_sync=adapter)."""
        return self.rank > 0 and self.rollout_sync == "adapter"
