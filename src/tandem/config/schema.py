"""The typed configuration of a Tandem run: one dataclass per section, every field with a default.

Units matter here, so every batch-size comment says what it counts:
  PROMPTS  rows of the dataset; a training step takes `data.train_batch_size` of them.
  SAMPLES  generated responses; each prompt gives `rollout.n` samples.
  TOKENS   prompt + response tokens.
"global" means summed over all data-parallel ranks, "per rank" means on one of them.

The critic settings that default to the actor's (`None = the actor's`) and `critic.enable: auto`
are filled in when the config is validated, so a loaded config has concrete values there
(other `auto` / None values, e.g. trainer.device, are the runtime's to resolve). The derived
numbers (world size, per-rank mini-batches, gradient-accumulation steps, ...) are in `cfg.derived`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tandem.config.derived import Derived

Truncation = Literal["error", "filter", "left", "right"]
ChatTemplate = Literal["auto", "plain", "none"]
Strategy = Literal["fsdp", "megatron"]
Dtype = Literal["float32", "bfloat16", "float16"]
LrScheduler = Literal["constant", "cosine", "linear"]
RolloutEngineName = Literal["hf", "vllm", "sglang"]
Device = Literal["cpu", "cuda", "auto"]
LoggerName = Literal["console", "jsonl", "tensorboard", "wandb", "mlflow"]
SamplingMetric = Literal["score", "acc"]


@dataclass
class DataConfig:
    """Prompt datasets and sequence lengths. Batch sizes here count PROMPTS."""

    train_files: list[str] = field(default_factory=list)  # parquet / jsonl files of training prompts
    val_files: list[str] = field(default_factory=list)  # parquet / jsonl validation prompts; [] = none
    prompt_key: str = "prompt"  # column holding the prompt (chat messages or plain text)
    max_prompt_length: int = 512  # TOKENS; longer prompts are handled as `truncation` says
    max_response_length: int = 512  # TOKENS generated per sample at most
    train_batch_size: int = 8  # PROMPTS per training step, global (x rollout.n = samples per step)
    val_batch_size: int | None = None  # PROMPTS per validation generation call; None = the whole val set
    truncation: Truncation = "error"  # over-long prompt: error, filter (drop it), left / right (cut that end)
    chat_template: ChatTemplate = "auto"  # auto = tokenizer's own, plain = Tandem's simple one, none = raw
    shuffle: bool = True  # reshuffle training prompts every epoch
    seed: int = 1  # seed of the shuffle


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule. Schedule lengths count TRAINING STEPS."""

    lr: float = 1e-6  # peak learning rate
    weight_decay: float = 0.01  # decoupled weight decay (AdamW)
    betas: tuple[float, float] = (0.9, 0.999)  # Adam moment decay rates
    eps: float = 1e-8  # Adam denominator epsilon
    lr_scheduler: LrScheduler = "constant"  # shape after warm-up
    warmup_steps: int = 0  # TRAINING STEPS of linear warm-up; when > 0 it wins over warmup_ratio
    warmup_ratio: float = 0.0  # fraction of all training steps used for warm-up (when warmup_steps == 0)
    min_lr_ratio: float = 0.0  # cosine / linear decay ends at lr * this


@dataclass
class FSDPConfig:
    """FSDP2 (`fully_shard`) settings, used when strategy == "fsdp"."""

    param_dtype: Dtype = "bfloat16"  # dtype of parameters in forward / backward (master weights stay float32)
    reduce_dtype: Dtype = "float32"  # dtype of the gradient reduce-scatter across ranks
    cpu_offload: bool = False  # keep sharded parameters, gradients and optimizer state in CPU memory
    sequence_parallel: int = 1  # RANKS splitting each sequence (Ulysses); data-parallel size = world / this


@dataclass
class MegatronConfig:
    """megatron-core model parallelism, used when strategy == "megatron". Sizes count RANKS."""

    tensor_parallel: int = 1  # ranks splitting each layer's weight matrices
    pipeline_parallel: int = 1  # ranks splitting the stack of layers
    context_parallel: int = 1  # ranks splitting each sequence
    expert_parallel: int = 1  # ranks splitting the experts of MoE layers


@dataclass
class ActorConfig:
    """The policy being trained and its PPO-style update."""

    model_path: str | None = None  # local Hugging Face folder of the initial policy
    strategy: Strategy = "fsdp"  # training engine; the critic and reference use the same one
    ppo_mini_batch_size: int = 4  # PROMPTS per optimizer step, global (x rollout.n = samples)
    micro_batch_size_per_rank: int = 2  # SAMPLES per forward / backward on one rank (gradient accumulation)
    use_dynamic_bsz: bool = False  # build micro-batches by token budget instead of sample count
    max_tokens_per_micro_batch: int = 16384  # TOKENS per micro-batch per rank when use_dynamic_bsz
    ppo_epochs: int = 1  # passes over each step's samples
    policy_loss: str = "vanilla"  # POLICY_LOSSES name: vanilla (PPO clip), gspo, reinforce
    clip_ratio_low: float = 0.2  # probability ratio is clipped below at 1 - this
    clip_ratio_high: float = 0.2  # ... and above at 1 + this (DAPO "clip-higher" raises it)
    clip_ratio_c: float = 3.0  # dual-clip bound on the loss of negative-advantage tokens; must be > 1
    loss_agg_mode: str = "token-mean"  # AGG_MODES name: how token losses become one number
    entropy_coeff: float = 0.0  # weight of the entropy bonus (0 = off)
    use_kl_loss: bool = False  # add a KL(actor || reference) term to the loss (GRPO style)
    kl_loss_coef: float = 0.001  # weight of that KL term
    kl_loss_type: str = "low_var_kl"  # KL_ESTIMATORS name for that term
    grad_clip: float | None = 1.0  # max global gradient norm; None = no clipping
    activation_checkpointing: bool = False  # recompute activations in backward to save memory
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)


@dataclass
class ValRolloutConfig:
    """Sampling for validation."""

    n: int = 1  # SAMPLES per validation prompt
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus sampling mass


@dataclass
class RolloutConfig:
    """Generation of training samples."""

    engine: RolloutEngineName = "hf"  # inference engine: hf (transformers generate), vllm, sglang (GPU only)
    n: int = 4  # SAMPLES generated per prompt (the group size of group estimators)
    temperature: float = 1.0  # sampling temperature; must be > 0 for training
    top_p: float = 1.0  # nucleus sampling mass (1 = off)
    top_k: int = -1  # sample from the k most likely tokens; -1 = off
    log_prob_micro_batch_size_per_rank: int = 8  # SAMPLES per forward when the actor recomputes log-probs
    tensor_parallel: int = 1  # RANKS per inference engine instance
    gpu_memory_utilization: float = 0.5  # fraction of GPU memory vLLM / SGLang may claim
    is_correction: str = "none"  # importance weights for rollout/trainer mismatch: none or an IS_LEVELS name
    is_threshold: float = 2.0  # importance weights are truncated at this value
    val: ValRolloutConfig = field(default_factory=ValRolloutConfig)


@dataclass
class ReferenceConfig:
    """The frozen initial policy (actor.model_path). It is loaded only when a KL term needs it:
    actor.use_kl_loss or algorithm.use_kl_in_reward (see cfg.derived.reference_needed)."""

    log_prob_micro_batch_size_per_rank: int = 8  # SAMPLES per forward


@dataclass
class CriticConfig:
    """The value model (PPO / GAE). Uses the actor's strategy and parallel settings."""

    enable: bool | Literal["auto"] = "auto"  # auto = on exactly when the advantage estimator needs values
    model_path: str | None = None  # None = actor.model_path (a value head is added)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    ppo_mini_batch_size: int | None = None  # PROMPTS per optimizer step, global; None = the actor's
    micro_batch_size_per_rank: int | None = None  # SAMPLES per forward / backward; None = the actor's
    ppo_epochs: int | None = None  # passes over each step's samples; None = the actor's
    cliprange_value: float = 0.5  # new values are clipped to old value +- this
    loss_agg_mode: str = "token-mean"  # AGG_MODES name
    grad_clip: float | None = 1.0  # max global gradient norm; None = no clipping


@dataclass
class RewardModelConfig:
    """A learned reward model, scored on the full prompt + response."""

    enable: bool = False  # score samples with a reward model (added to rule-based scores)
    model_path: str | None = None  # local Hugging Face folder of a sequence-classification model
    micro_batch_size_per_rank: int = 8  # SAMPLES per forward


@dataclass
class OverlongConfig:
    """DAPO soft overlong punishment: a linear penalty over the last `buffer_len` allowed tokens."""

    enable: bool = False  # apply the penalty
    buffer_len: int = 128  # TOKENS before max_response_length where the penalty starts
    penalty_factor: float = 1.0  # penalty reaches -this at max_response_length


@dataclass
class FormatConfig:
    """A reward term for the shape of a response, added to the task score."""

    enable: bool = False  # apply the term
    pattern: str = r"<think>.*</think>"  # regex of a well-formed response (`.` matches newlines)
    fullmatch: bool = False  # false = found anywhere in the response, true = the whole response must match
    match_reward: float = 0.0  # added to the score when the response matches
    mismatch_reward: float = -1.0  # added when it does not


@dataclass
class RewardConfig:
    """How samples are scored: rule functions (built-in by data_source, or your own) and optional terms."""

    custom_reward_file: str | None = None  # Python file with your scoring function; None = built-in scorers
    custom_reward_function: str = "compute_score"  # name of the function in that file
    custom_reward_kwargs: dict[str, Any] = field(default_factory=dict)  # extra keyword arguments passed to it
    timeout_s: float = 10.0  # SECONDS one scoring call may take; a timeout scores 0
    num_workers: int = 1  # processes scoring in parallel; 0 = in the controller process
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    format: FormatConfig = field(default_factory=FormatConfig)


@dataclass
class KLControlConfig:
    """Coefficient of the KL penalty in the reward (algorithm.use_kl_in_reward)."""

    type: str = "fixed"  # KL_CONTROLLERS name: fixed or adaptive
    kl_coef: float = 0.001  # coefficient (the initial one when adaptive)
    target_kl: float = 0.1  # adaptive: KL per token the controller steers toward
    horizon: int = 10000  # adaptive: SAMPLES over which the coefficient moves toward target


@dataclass
class DynamicSamplingConfig:
    """DAPO dynamic sampling: drop groups whose samples all score the same, generate more to refill."""

    enable: bool = False  # filter groups and regenerate
    metric: SamplingMetric = "acc"  # per-sample value whose spread within a group must be > 0
    max_num_gen_batches: int = 10  # generation rounds per step before giving up; 0 = no limit
    gen_batch_size: int | None = None  # PROMPTS per generation round; None = data.train_batch_size


@dataclass
class AlgorithmConfig:
    """Advantages and reward shaping done by the controller."""

    adv_estimator: str = "grpo"  # ADV_ESTIMATORS name: gae, grpo, dr_grpo, rloo, remax, ...
    gamma: float = 1.0  # discount per token
    lam: float = 1.0  # GAE lambda
    norm_adv_by_std: bool = True  # group estimators: divide by the group's score std (Dr. GRPO: false)
    use_kl_in_reward: bool = False  # subtract kl_coef * KL(actor || reference) from token rewards (PPO style)
    kl_penalty: str = "kl"  # KL_ESTIMATORS name for that penalty
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)


@dataclass
class TrainerConfig:
    """The loop, the machines, logging and checkpoints. Frequencies count TRAINING STEPS."""

    project_name: str = "tandem"  # groups runs in the trackers
    experiment_name: str = "run"  # this run's name; outputs go to output_dir/project_name/experiment_name
    total_epochs: int = 1  # passes over the training prompts
    total_training_steps: int | None = None  # stop after this many steps; None = total_epochs of data
    nnodes: int = 1  # machines
    workers_per_node: int = 1  # RANKS per machine: GPUs, or CPU processes
    device: Device = "auto"  # auto = cuda when available, else cpu
    seed: int = 1  # seed of model init, sampling and everything else that is random
    loggers: list[LoggerName] = field(default_factory=lambda: ["console"])  # metric trackers
    save_freq: int = -1  # steps between checkpoints; -1 = never (the final one is still saved)
    test_freq: int = -1  # steps between validations; -1 = never
    val_before_train: bool = False  # validate once before the first step
    output_dir: str = "outputs"  # root folder of checkpoints and logs
    resume: str = "auto"  # auto = latest checkpoint of this experiment if any, disable, or a checkpoint path
    max_checkpoints_to_keep: int | None = None  # older checkpoints are deleted; None = keep all
    critic_warmup: int = 0  # first steps that train only the critic


@dataclass
class TandemConfig:
    """A whole run. Build it with `load_config`; `cfg.derived` holds the normalised batch sizes."""

    data: DataConfig = field(default_factory=DataConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # Computed by validate(); never read from YAML and never written by to_dict().
    _derived: Derived | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def derived(self) -> Derived:
        """World size, samples per step, per-rank mini/micro-batches, which models are needed."""
        if self._derived is None:
            from tandem.config.errors import ConfigError

            raise ConfigError(
                "cfg.derived is computed by validation: call cfg.validate() (load_config does)."
            )
        return self._derived

    def validate(self, *, require_data: bool = False) -> TandemConfig:
        """Fill in inherited values, check every rule, compute `derived`; raise ConfigError listing all problems."""
        from tandem.config.errors import Problems
        from tandem.config.validate import finalize

        problems = Problems()
        finalize(self, problems, require_data=require_data)
        problems.raise_if_any()
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, require_data: bool = False) -> TandemConfig:
        """Build and validate a config from nested plain values (as read from YAML)."""
        from tandem.config.loader import build

        return build(data, require_data=require_data)

    def to_dict(self) -> dict[str, Any]:
        """Nested plain values (lists, not tuples), ready for YAML or JSON."""
        from tandem.config.coerce import to_plain

        return to_plain(self)

    def to_yaml(self) -> str:
        """YAML text that `load_config` reads back into an equal config."""
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)
