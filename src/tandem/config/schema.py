"""The typed configuration of a Tandem run: one dataclass per section, every field with a default.

Units matter here, so every batch-size comment says what it counts:
  PROMPTS  rows of the dataset; a training step takes `data.train_batch_size` of them.
  SAMPLES  generated responses; each prompt gives `rollout.n` samples.
  TOKENS   prompt + response tokens.
"global" means summed over all data-parallel ranks, "per rank" means on one of them.
The rules that tie the training batch sizes together are in ActorConfig's docstring; the sizes of
forward-only passes (log-prob recomputation, reference, reward model) and data.val_batch_size need
not divide anything: the last micro-batch is smaller.

The critic settings that default to the actor's (`None = the actor's`) and `critic.enable: auto`
are filled in when the config is validated, so a loaded config has concrete values there
(other `auto` / None values, e.g. trainer.device, are the runtime's to resolve). The derived
numbers (world size, per-rank mini-batches, gradient-accumulation steps, ...) are in `cfg.derived`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tandem.config.errors import ConfigError
from tandem.config.schema_engine import (  # the engine sections, re-exported here
    ActorLoraConfig,
    FSDPConfig,
    LoraConfig,
    MegatronConfig,
    OptimConfig,
)

Truncation = Literal["error", "filter", "left", "right"]
ChatTemplate = Literal["auto", "plain", "none"]
Strategy = Literal["fsdp", "megatron"]
RolloutEngineName = Literal["auto", "hf", "vllm", "sglang"]
RolloutMode = Literal["sync", "async"]
RolloutLayout = Literal["hybrid", "separate"]
TruncateSide = Literal["left", "right", "middle"]
ToolCallFormat = Literal["hermes"]
RouterReplayMode = Literal["off", "R2", "R3"]
Device = Literal["cpu", "cuda", "auto"]
RewardManagerSource = Literal["register", "importlib"]
LoggerName = Literal["console", "jsonl", "tensorboard", "wandb", "mlflow"]
Backend = Literal["ray", "inprocess"]
Placement = Literal["colocate", "separate"]
AsyncMode = Literal["synchronous", "one_step_off", "streaming"]
ProfiledPhase = Literal[
    "generate",
    "compute_log_probs",
    "compute_ref_log_probs",
    "compute_values",
    "compute_rm_scores",
    "update_actor",
    "update_critic",
]
ProfilerActivity = Literal["cpu", "cuda"]
PFPPOMethod = Literal["pow", "max_min", "max_random"]  # tandem.algos.PF_PPO_WEIGHTS' names
ProfilerTool = Literal["torch", "nsys"]  # trainer.profile.tool

# Nsight Systems' options for each worker under trainer.profile.tool=nsys (`nsys profile --NAME=VALUE`, given to
# Ray's runtime_env "nsight"): verl's worker_nsight_options defaults, with one capture range per profiled call
NSIGHT_WORKER_OPTIONS = {
    "trace": "cuda,nvtx,cublas,ucx",
    "cuda-memory-usage": "true",
    "cuda-graph-trace": "graph",
    "capture-range": "cudaProfilerApi",
    "capture-range-end": "repeat",
    "kill": "none",
}


@dataclass
class DataConfig:
    """Prompt datasets and sequence lengths. Batch sizes here count PROMPTS."""

    train_files: list[str] = field(default_factory=list)  # parquet / jsonl files of training prompts
    val_files: list[str] = field(default_factory=list)  # parquet / jsonl validation prompts; [] = none
    prompt_key: str = "prompt"  # column holding the prompt (chat messages or plain text)
    image_key: str = (
        "images"  # column of a row's images, one <image> in its messages each (vision-language models)
    )
    # a torch Dataset class of your own that makes the RL prompt rows, or tandem sft's rows (verl's
    # data.custom_cls.path / .name): the Python file and the class's name in it, built as verl builds it on
    # train_files and on val_files, cls(data_files, tokenizer, config, processor) for RL (items: verl's row
    # dicts), cls(parquet_files, tokenizer, config) for SFT (items: input_ids, loss_mask, ...; docs/own-model.md).
    # None: the files' rows as they are
    custom_dataset_file: str | None = None
    custom_dataset_class: str | None = None
    max_prompt_length: int = 512  # TOKENS per prompt at most, >= 1; longer ones follow `truncation`
    max_response_length: int = 512  # TOKENS generated per sample at most, >= 1
    max_length: int | None = None  # SFT only: TOKENS of prompt + response + EOS; None = the two above summed
    response_key: str = "response"  # SFT only: column holding the target response text
    # SFT only: keys into a nested column, in order: prompt_key=extra_info with [question] reads the prompt from
    # row["extra_info"]["question"] (verl's prompt_dict_keys); [] = the column itself
    prompt_dict_keys: list[str] = field(default_factory=list)
    response_dict_keys: list[str] = field(default_factory=list)  # SFT only: the same for response_key
    messages_key: str | None = (
        "messages"  # SFT only: column of whole conversations (assistant turns trained); null: none
    )
    # SFT only, conversations: the tokens of an assistant turn trained. stop: its content and the stop token that
    # ends it (generation_config.json's eos), where the rollout stops; turn: the template's whole turn after the
    # generation prompt, the text after the stop token included (`<|im_end|>\n`), as verl's SFT trains it (the
    # verl_sft presets); needs no stop token in the template
    sft_loss_mask: Literal["stop", "turn"] = "stop"
    train_batch_size: int = 8  # PROMPTS per training step, global (x rollout.n = samples per step)
    val_batch_size: int | None = None  # PROMPTS per validation generation call, global; None = all at once
    truncation: Truncation = "error"  # over-long prompt: error, filter (drop it), left / right (cut that end; `right` keeps the chat template's generation prompt); SFT: error or right
    chat_template: ChatTemplate = "auto"  # auto = the tokenizer's, plain = Tandem's simple one, none = raw
    # variables of the tokenizer's chat template, name -> text / number / bool / null: {enable_thinking: false}
    # (Qwen3), {reasoning_effort: medium} (gpt-oss); every rendering gets them: training and validation prompts,
    # SFT rows, the agent loop's turns (verl's data.apply_chat_template_kwargs)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    shuffle: bool = True  # reshuffle the training prompts every epoch
    seed: int = 1  # seed of the shuffle
    # a sampler class of your own, the training prompts' order in place of shuffle / seed (verl's
    # data.sampler.class_path / class_name): the Python file (or pkg://package.module) and the class's name in it,
    # built as cls(data_source, data_config); with update(batch), a curriculum (docs/own-model.md). None: Tandem's
    sampler_file: str | None = None
    sampler_class: str | None = None


@dataclass
class ActorConfig:
    """The policy being trained and its PPO-style update.

    A step's data.train_batch_size x rollout.n samples are cut into mini-batches of
    ppo_mini_batch_size x rollout.n samples, one optimizer step each, ppo_epochs times over. Each of
    the dp data-parallel ranks (cfg.derived.dp_size) holds 1/dp of a mini-batch and runs it in
    micro-batches of micro_batch_size_per_rank samples, accumulating gradients. So:
      ppo_mini_batch_size divides data.train_batch_size;
      ppo_mini_batch_size x rollout.n is a multiple of dp;
      micro_batch_size_per_rank divides the per-rank mini-batch, ppo_mini_batch_size x rollout.n / dp.
    With use_dynamic_bsz (the default) the micro-batch sizes (here, the critic's, reference.log_prob_...,
    rollout.log_prob_... and the reward model's) are unused: each rank cuts its share into the fewest
    micro-batches of at most max_tokens_per_micro_batch tokens, balanced in tokens, the same count on
    every rank; that budget must hold one full sample (data.max_prompt_length + max_response_length; SFT:
    data.max_length when set).
    The loss is normalised by global counts, so how samples are cut into micro-batches changes no number.
    """

    model_path: str | None = None  # local Hugging Face folder of the initial policy (and of the reference)
    tokenizer_path: str | None = None  # folder of the tokenizer (prompts, rollout, SFT); None = model_path
    strategy: Strategy = "fsdp"  # training engine: fsdp or megatron; the critic and reference use the same
    ppo_mini_batch_size: int = 4  # PROMPTS per optimizer step, global (x rollout.n = samples)
    micro_batch_size_per_rank: int = 2  # SAMPLES per forward / backward on one rank
    use_dynamic_bsz: bool = True  # cut micro-batches by token budget, not sample count (every role)
    max_tokens_per_micro_batch: int | None = None  # TOKENS per micro-batch, rank; None: 2048 CPU, 16384 GPU
    sequence_packing: bool = True  # forward / backward on packed sequences, no padding computed (every role)
    old_log_probs_from_update: bool = True  # one optimizer step per step: no old-log-prob pass (derived)
    ppo_epochs: int = 1  # passes over each step's samples, >= 1
    calculate_sum_pi_squared: bool = False  # old-log-prob pass adds sum_v pi_v^2 per token (for OTB)
    policy_loss: str = "vanilla"  # vanilla (PPO clip) or another of docs/algorithms.md's: gspo, dro, ...
    tau_pos: float = 1.0  # > 0: sapo's gate temperature where the advantage is positive (verl's default)
    tau_neg: float = 1.05  # > 0: ... and where it is not
    clip_cov_ratio: float = 0.0002  # in (0, 1]: clip_cov drops this share of the valid tokens (at least 1)
    clip_cov_lb: float = 1.0  # clip_cov drops only tokens whose (A - mean A)(logp - mean logp) is above this
    clip_cov_ub: float = 5.0  # > clip_cov_lb: ... and below this
    kl_cov_ratio: float = 0.0002  # in (0, 1]: kl_cov penalises this share of the valid tokens (at least 1)
    ppo_kl_coef: float = 0.1  # >= 0: kl_cov's weight of |logp - old| on those tokens
    dro_beta: float | None = None  # > 0, required by dro: weight of its penalty beta/2 (logp - old)^2
    clip_ratio_low: float = 0.2  # in [0, 1): the probability ratio is clipped below at 1 - this
    clip_ratio_high: float = 0.2  # >= 0: ... and above at 1 + this (DAPO's "clip-higher" raises it, 0.28)
    clip_ratio_c: float = 3.0  # > 1: dual clip; a negative-advantage token's loss is <= this x |advantage|
    loss_agg_mode: str = "token-mean"  # token-mean, seq-mean-token-sum, seq-mean-token-mean, ...-sum-norm
    entropy_coeff: float = 0.0  # weight of the entropy bonus; 0 = off
    use_kl_loss: bool = False  # add a KL(actor || reference) loss term (GRPO style); loads the reference
    kl_loss_coef: float = 0.001  # >= 0: weight of that KL term
    kl_loss_type: str = "low_var_kl"  # kl (k1), abs, mse (k2), low_var_kl (k3); "+" suffix: k2 gradient
    grad_clip: float | None = 1.0  # > 0: max global gradient norm; null = no clipping
    # mixture-of-experts models (FSDP2): weight of the routers' load-balancing loss, mean over the MoE layers of
    # E/k sum_e P_e f_e (1 = even routing; engine/moe.py), added to the actor's (and SFT's) loss; >= 0, 0 = off;
    # null = the model's own weight, num_experts_per_tok x its config's router_aux_loss_coef
    router_aux_loss_coef: float | None = None
    # MoE models: R2 = the update routes each token to the experts of the old-log-prob pass (verl's router_replay;
    # engine/router_replay.py); R3 (the rollout engine's routing) is not built; off: every pass routes itself
    router_replay: RouterReplayMode = "off"
    activation_checkpointing: bool = False  # recompute activations in backward to save memory
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    lora: ActorLoraConfig = field(default_factory=ActorLoraConfig)
    # a vision-language model's vision tower is not trained (FSDP2): no gradient, no optimizer state; the rollout
    # still gets it with every weight sync. A text model has none to freeze (a warning)
    freeze_vision_tower: bool = False
    # FSDP2: attributes set on the model's Hugging Face config before the model is built (verl's
    # model.override_config), for the actor, the reference and the rollout engine alike (vLLM: as its
    # hf_overrides); a mapping value sets a sub-config's attributes (text_config: {...}). Kept in the export.
    # The attention kernel is actor.fsdp.attn_implementation, not an attribute here
    override_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class ValRolloutConfig:
    """Sampling for validation."""

    n: int = 1  # SAMPLES per validation prompt, >= 1; > 1 needs temperature > 0
    temperature: float = 0.0  # >= 0; 0 = greedy
    top_p: float = 1.0  # nucleus sampling mass in (0, 1]; 1 = off


@dataclass
class MultiTurnConfig:
    """Agentic rollouts (rollout.mode=async): tools the model calls and a simulated user (rollout/agent.py)."""

    tools: list[str] = field(default_factory=list)  # built-in tools the model may call: calculator, python
    tool_file: str | None = None  # a Python file of more tools (TOOLS list or @tandem.tools.tool)
    interaction: str | None = None  # a simulated user: try_again, or one from interaction_file
    interaction_file: str | None = None  # a Python file defining INTERACTION (tandem/tools)
    max_assistant_turns: int = 5  # >= 1: model turns per trajectory
    max_user_turns: int = 2  # >= 0: interaction replies per trajectory
    max_parallel_calls: int = 1  # >= 1: tool calls run per model turn; further ones get an error result
    max_tool_response_length: int = 256  # >= 1: CHARACTERS of a tool result the model reads
    tool_response_truncate_side: TruncateSide = "middle"  # where a long result is cut: left, right, middle
    tool_timeout_s: float = 10.0  # > 0: wall-clock seconds per tool call; a timeout is an error result
    # > 0: wall-clock seconds per trajectory (turns, tools, interaction); one over it ends with the tokens it
    # has (a turn being generated is dropped), finish "time_limit" (agent/finish_time_limit_ratio), no error
    trajectory_timeout_s: float = 600.0
    format: ToolCallFormat = "hermes"  # tool call syntax: hermes = <tool_call>{json}</tool_call> (Qwen)


@dataclass
class RolloutConfig:
    """Generation of training samples."""

    engine: RolloutEngineName = (
        "auto"  # inference engine: auto (vllm where installed, else hf), vllm, hf, sglang
    )
    mode: RolloutMode = "sync"  # sync: one batched generate; async: the agent loop, one coroutine per sample
    # hybrid: each actor rank holds an engine, synced in process; separate: engines in a pool of their own,
    # weights sent from the trainer over a process group spanning both (roles/weight_bus.py)
    layout: RolloutLayout = "hybrid"
    nnodes: int = 1  # >= 1: machines of the separate rollout pool
    # >= 1: rollout ranks (engines) per machine of that pool; auto: half a node's GPUs (derived.py), 1 on a CPU
    workers_per_node: int | Literal["auto"] = "auto"
    weight_bucket_mb: int = 256  # >= 1: MiB per broadcast of the separate layout's weight sync
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    cpu_kv_cache_gib: int = 1  # >= 1: GiB of KV cache per vLLM engine on CPU (VLLM_CPU_KVCACHE_SPACE wins)
    n: int = 4  # SAMPLES per prompt (the group size of group estimators: >= 2 for grpo, rloo, ...)
    temperature: float = 1.0  # sampling temperature, > 0 (training needs sampling; greedy is for rollout.val)
    top_p: float = 1.0  # nucleus sampling mass in (0, 1]; 1 = off
    top_k: int = -1  # sample from the k most likely tokens, k >= 1; -1 = off
    log_prob_micro_batch_size_per_rank: int = 8  # SAMPLES per forward on one rank, recomputing log-probs
    tensor_parallel: int = 1  # RANKS per inference engine instance; divides the world size; 1 for hf
    # with tensor_parallel > 1: each rank receives only the part of each weight its share of the engine keeps
    # (models/tp_cuts.py; FSDP2, or megatron of the same TP size; known decoder families, no LoRA)
    shard_weight_sync: bool = True
    gpu_memory_utilization: float = 0.5  # in (0, 1]: fraction of GPU memory vLLM / SGLang may claim
    # keyword arguments for vLLM's engine (vllm.LLM), e.g. {attention_backend: CPU_MLA}; not those Tandem sets
    # from its own keys (model, dtype, tensor_parallel_size, seed, ...: an error names them); verl's
    # actor_rollout_ref.rollout.engine_kwargs.vllm.NAME is rollout.engine_kwargs.NAME
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    is_correction: str = "none"  # older name of algorithm.rollout_correction.rollout_is (none = null)
    is_threshold: float = 2.0  # older name of algorithm.rollout_correction.rollout_is_threshold
    val: ValRolloutConfig = field(default_factory=ValRolloutConfig)


@dataclass
class ReferenceConfig:
    """The frozen initial policy (actor.model_path). It is loaded only when a KL term needs it:
    actor.use_kl_loss or algorithm.use_kl_in_reward (see cfg.derived.reference_needed)."""

    log_prob_micro_batch_size_per_rank: int = 8  # SAMPLES per forward on one rank
    megatron_param_offload: bool = False  # megatron: its parameters in host memory between its forwards


@dataclass
class CriticConfig:
    """The value model (PPO / GAE). Shares the actor's strategy, parallel sizes and use_dynamic_bsz.

    Batch sizes follow the same rules as the actor's (see ActorConfig)."""

    enable: bool | Literal["auto"] = "auto"  # auto = on exactly when the estimator needs values (gae)
    model_path: str | None = None  # None = actor.model_path (a value head is added)
    tokenizer_path: str | None = None  # None = model_path's (both None: the actor's); compared to actor's
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    ppo_mini_batch_size: int | None = None  # PROMPTS per optimizer step, global; None = the actor's
    micro_batch_size_per_rank: int | None = None  # SAMPLES per forward / backward on one rank; None = actor's
    ppo_epochs: int | None = None  # passes over each step's samples; None = the actor's
    cliprange_value: float = 0.5  # >= 0: new values are clipped to old value +- this
    loss_agg_mode: str = "token-mean"  # as actor.loss_agg_mode
    grad_clip: float | None = 1.0  # > 0: max global gradient norm; null = no clipping
    lora: LoraConfig = field(
        default_factory=LoraConfig
    )  # adapters on the critic; its value head trains whole
    # FSDP2: attributes set on the critic's Hugging Face config before it is built (verl's
    # critic.model.override_config: the critic's own; it does not take the actor's)
    override_config: dict[str, Any] = field(default_factory=dict)
    # megatron: the critic's starting weights, a megatron distributed checkpoint (as actor.megatron.dist_checkpoint;
    # its output layer is not read unless it is a value head: a new head starts as from model_path)
    megatron_dist_checkpoint: str | None = None
    # the critic's attention kernel (as actor.fsdp.attn_implementation); null = the actor's
    attn_implementation: (
        Literal["auto", "sdpa", "eager", "flash_attention_2", "varlen", "flex_attention", "sdpa_split"] | None
    ) = None


@dataclass
class RewardModelConfig:
    """A learned reward model, scored on the full prompt + response."""

    enable: bool = False  # score samples with a reward model (added to rule-based scores); needs model_path
    model_path: str | None = None  # local Hugging Face folder of a sequence-classification model
    tokenizer_path: str | None = None  # None = model_path; it reads the actor's token ids: checked to match
    micro_batch_size_per_rank: int = 8  # SAMPLES per forward on one rank


@dataclass
class OverlongConfig:
    """DAPO soft overlong punishment: a linear penalty over the last `buffer_len` allowed tokens."""

    enable: bool = False  # apply the penalty
    buffer_len: int = 128  # TOKENS before data.max_response_length where the penalty starts; < that length
    penalty_factor: float = 1.0  # >= 0: the penalty reaches -this at max_response_length
    # TOKENS where the penalty reaches -penalty_factor; null = data.max_response_length (verl's DAPO max_resp_len)
    max_length: int | None = None


@dataclass
class FormatConfig:
    """A reward term for the shape of a response, added to the task score."""

    enable: bool = False  # apply the term
    pattern: str = r"<think>.*</think>"  # Python regex of a well-formed response (`.` matches newlines)
    fullmatch: bool = False  # false = found anywhere in the response, true = the whole response must match
    match_reward: float = 0.0  # added to the score when the response matches
    mismatch_reward: float = -1.0  # added when it does not


@dataclass
class SandboxFusionConfig:
    """Where the code scorer (rewards/scorers/code.py: data_sources codecontests, apps, codeforces, taco) runs a
    response's program: Sandbox Fusion's run_code API at `url`, or a local subprocess when it is None."""

    url: str | None = (
        None  # e.g. https://<your endpoint>/run_code; None = run locally (not a security sandbox)
    )
    max_concurrent: int = 64  # >= 1: test cases in flight at once, over all reward.num_workers processes
    memory_limit_mb: int = 1024  # >= 0: a program's memory limit (0 = none)


@dataclass
class RewardConfig:
    """How samples are scored: rule functions (built-in by data_source, or your own) and optional terms."""

    custom_reward_file: str | None = None  # Python file with your scoring function; None = built-in scorers
    custom_reward_function: str = "compute_score"  # name of the function in that file
    custom_reward_kwargs: dict[str, Any] = field(default_factory=dict)  # extra keyword arguments passed to it
    # How your function is called (verl's reward manager): naive = once per sample; batch = once per scored batch
    # with lists (data_sources=, solution_strs=, ground_truths=, extra_infos=), returning one score per sample.
    # With manager_source=importlib: the name of a reward-manager class (verl's interface) in manager_file
    manager: str = "naive"
    manager_source: RewardManagerSource = "register"  # register: naive / batch; importlib: a class of yours
    manager_file: str | None = None  # Python file (or pkg://package/module) of an importlib manager class
    # keyword arguments of each batch call (manager=batch), or of the class's constructor (verl's reward_kwargs)
    manager_kwargs: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 10.0  # SECONDS a sample's scoring may take, > 0 (batch: x its samples); timeout = 0
    num_workers: int = 1  # processes scoring in parallel, >= 0; 0 = in the controller process
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    sandbox_fusion: SandboxFusionConfig = field(
        default_factory=SandboxFusionConfig
    )  # the code scorer's runner
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    format: FormatConfig = field(default_factory=FormatConfig)
    # Agent loop: add the sum of a trajectory's tool step rewards to its score (reward term "tool_reward",
    # rewards/terms.py). false: verl's way, the step rewards only reach your function as extra_info["tool_rewards"]
    tool_rewards: bool = True


@dataclass
class KLControlConfig:
    """Coefficient of the KL penalty in the reward (algorithm.use_kl_in_reward)."""

    type: str = "fixed"  # fixed or adaptive
    kl_coef: float = 0.001  # >= 0: the coefficient (the initial one when adaptive)
    target_kl: float = 0.1  # > 0, adaptive only: KL per token the controller steers toward
    horizon: int = 10000  # >= 1, adaptive only: SAMPLES over which the coefficient moves toward target


@dataclass
class DynamicSamplingConfig:
    """DAPO dynamic sampling: drop groups whose samples all score the same, generate more to refill.

    Each round generates gen_batch_size prompts x rollout.n samples and keeps the groups with a
    spread; rounds repeat until data.train_batch_size prompts are kept (the surplus is cut)."""

    enable: bool = False  # filter groups and regenerate; needs rollout.n >= 2
    # the per-sample value whose spread within a group must be > 0 (verl's filter_groups.metric): acc; score or
    # seq_reward, the summed token-level scores; seq_final_reward, the summed token-level rewards (the scores
    # with their reward terms, overlong included; refused with use_kl_in_reward); or a reward term's name that
    # the reward function returns for every sample (checked on the first round)
    metric: str = "acc"
    max_num_gen_batches: int = 10  # >= 0: rounds per step before the run stops with an error; 0 = no limit
    gen_batch_size: int | None = None  # PROMPTS per round, global; None = data.train_batch_size


@dataclass
class RolloutCorrectionConfig:
    """Correction for the rollout engine's policy differing from the trainer's (verl's keys and defaults).

    IS weights r = pi_old / pi_rollout, truncated at rollout_is_threshold (TIS), zero outside the IcePop
    band, optionally divided by their batch mean; rejection sampling drops tokens / sequences from the
    loss's mask (tandem.algos.rollout_correction). `rollout.is_correction` / `rollout.is_threshold`
    are older names of rollout_is / rollout_is_threshold, copied here at start-up.

    bypass_mode (verl's): the rollout's log-probs serve as the old log-probs, so there is no
    old-log-prob pass; IS weights and rejection then compare the policy being updated with the rollout's,
    micro-batch by micro-batch. loss_type=ppo_clip keeps actor.policy_loss (its ratio to the rollout policy
    is the correction; IS weights are not applied), reinforce uses REINFORCE with the IS weights.
    """

    rollout_is: str | None = None  # IS weights per token or sequence; null = none
    # > 0: IS weights truncated at this value; verl's "lower_upper" (e.g. "0.5_2.0") is the IcePop band:
    # copied into the band keys at start-up, the threshold becoming upper
    rollout_is_threshold: float | str = 2.0
    rollout_is_band_low: float | None = None  # IcePop: weight 0 where r < low, in [0, 1]
    rollout_is_band_high: float | None = None  # ... and where r > high, >= 1; both or neither
    rollout_is_batch_normalize: bool = False  # weights / their mean over kept tokens (sequences)
    rollout_rs: str | None = None  # rejection options, comma-separated: token_k1, seq_mean_k3, ...
    rollout_rs_threshold: float | str | None = None  # per option: "lower_upper" (k1), upper (k2, k3)
    bypass_mode: bool = False  # rollout log-probs as the old ones: no old-log-prob pass
    loss_type: str = "ppo_clip"  # bypass mode's loss: ppo_clip (actor.policy_loss) or reinforce (IS-weighted)


@dataclass
class PFPPOConfig:
    """PF-PPO (policy filtration): after the advantages, the critic's and the actor's updates train on B rows drawn
    with replacement from the step's B by each row's summed score (tandem.algos.pf_ppo); metrics and sample dumps
    stay those of the rows generated. Seeded by trainer.seed and the step."""

    enable: bool = False  # resample the update's rows (verl's algorithm.use_pf_ppo); any adv_estimator
    reweight_method: PFPPOMethod = "pow"  # pow (|score|^weight_pow), max_min, max_random: docs/algorithms.md
    weight_pow: float = 2.0  # >= 0: pow's exponent


@dataclass
class AlgorithmConfig:
    """Advantages and reward shaping done by the controller."""

    # gae (needs the critic); grpo, dr_grpo, rloo, opo, gpg (groups of rollout.n >= 2);
    # remax (a greedy baseline sample); reinforce_plus_plus, reinforce_plus_plus_baseline;
    # gdpo (several reward terms, each group-normalised: gdpo_reward_keys); docs/algorithms.md lists them all
    adv_estimator: str = "grpo"
    gamma: float = 1.0  # in [0, 1]: discount per token
    lam: float = 1.0  # in [0, 1]: GAE lambda
    norm_adv_by_std: bool = True  # group estimators: divide by the group's score std (Dr. GRPO: false)
    # gdpo only: the reward terms normalised one by one, named as the scorer's returned dict names them
    # ({"score": ..., "correct": 1.0, "format": 0.5}) or as a reward term (format, overlong) or scorer_score
    gdpo_reward_keys: list[str] = field(default_factory=list)
    gdpo_reward_weights: list[float] | None = None  # one per gdpo_reward_keys, in order; null = all 1.0
    use_kl_in_reward: bool = False  # subtract kl_coef x KL(actor || reference) from token rewards (PPO style)
    kl_penalty: str = "kl"  # estimator for that penalty, as actor.kl_loss_type
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)


@dataclass
class ProfileConfig:
    """Profiles of chosen worker calls (roles/profile.py), off (no cost) while `steps` is empty.

    tool=torch: torch.profiler, one Chrome trace per call, for each chosen rank of every worker group, written as
    <output_dir>/step<N>/<group>_rank<R>_<phase>.pt.trace.json (Perfetto and TensorBoard's profiler plugin open
    them). tool=nsys: Nsight Systems on a CUDA machine; each Ray worker runs under `nsys profile` with
    `nsight_options`, and a chosen call opens one capture range (cudaProfilerStart / Stop) marked by an NVTX
    range named <group>_rank<R>_<phase>_step<N>. Nsight writes its .nsys-rep files where Ray puts them
    (/tmp/ray/session_*/logs/nsight); with trainer.backend=inprocess, run `nsys profile
    --capture-range=cudaProfilerApi tandem train ...` yourself."""

    tool: ProfilerTool = "torch"

    steps: list[int] = field(default_factory=list)  # training steps to profile, each >= 1; [] = off
    ranks: list[int] = field(default_factory=lambda: [0])  # ranks of each worker group; [] = every rank
    phases: list[ProfiledPhase] = field(default_factory=list)  # worker calls to trace; [] = all of them
    activities: list[ProfilerActivity] = field(default_factory=lambda: ["cpu", "cuda"])  # cuda: on a GPU only
    memory: bool = False  # record tensor allocations (profile_memory)
    with_stack: bool = False  # record Python call stacks (larger traces)
    output_dir: str | None = None  # None = the run's folder / profile (tool=torch)
    nsight_options: dict[str, Any] = field(default_factory=dict)  # tool=nsys: over NSIGHT_WORKER_OPTIONS


@dataclass
class TrainerConfig:
    """The loop, the machines, logging and checkpoints. Frequencies count TRAINING STEPS."""

    project_name: str = "tandem"  # groups runs in the trackers
    experiment_name: str = "run"  # this run's name; outputs go to output_dir/project_name/experiment_name
    total_epochs: int = 1  # passes over the training prompts, >= 1
    total_training_steps: int | None = None  # stop after this many steps, >= 1; None = total_epochs of data
    nnodes: int = 1  # machines, >= 1
    # RANKS per machine (GPUs, or CPU processes); world size = nnodes x this. auto = every GPU of a node (less the
    # rollout pool's in rollout.layout=separate), else 2 CPU ranks (inprocess: 1); the start-up line says which
    workers_per_node: int | Literal["auto"] = "auto"
    device: Device = "auto"  # cpu, cuda, or auto = cuda when available, else cpu
    backend: Backend = (
        "ray"  # ray = one process per rank (local Ray or a cluster); inprocess = one process, 1 rank
    )
    ray_address: str | None = (
        None  # None = start a local Ray; "auto" = join the cluster of `ray start --head`
    )
    placement: Placement = (
        "colocate"  # colocate = critic / reward model share the actor's GPUs; separate = own pools
    )
    cpus_per_worker: float = 1.0  # CPUs Ray reserves per rank (> 0); torch threads per rank follow it
    seed: int = 1  # seed of model init, sampling and everything else that is random
    # each mini-batch's (and forward's) rows split over the data-parallel ranks by tokens; false: in the rollout's
    # order, contiguous (verl's balance_batch; its true also moves rows between mini-batches, Tandem's never)
    balance_batch: bool = True
    # metric trackers, any of: console, jsonl, tensorboard, wandb, mlflow
    loggers: list[LoggerName] = field(default_factory=lambda: ["console"])
    save_freq: int = -1  # steps between checkpoints, >= 1; -1 = none (trainer.save_final: the last one)
    save_final: bool = True  # checkpoint after the last step; false + save_freq=-1 = no checkpoints at all
    test_freq: int = -1  # steps between validations, >= 1; -1 = never
    val_before_train: bool = False  # validate once before the first step
    # with val_before_train: validate the starting (or resumed) actor once, log it, and stop; no step is trained
    # (verl's trainer.val_only; as on verl it does nothing without val_before_train and validation data)
    val_only: bool = False
    output_dir: str = "outputs"  # root folder of checkpoints and logs
    run_dir: str | None = None  # the run folder itself (verl's default_local_dir); None = the nesting above
    resume: str = "auto"  # auto = latest checkpoint of this experiment if any, disable, or a checkpoint path
    max_checkpoints_to_keep: int | None = None  # >= 1: older checkpoints are deleted; None = keep all
    # each checkpoint's global_step_N/actor/huggingface holds the actor's config, tokenizer and generation files;
    # true: its weights too (safetensors; LoRA: merged, and the adapters in lora_adapter/). verl's key:
    # actor_rollout_ref.actor.checkpoint.save_contents holding 'hf_model'
    save_hf_model: bool = False
    critic_warmup: int = 0  # first steps that train only the critic, >= 0
    # synchronous: generate, then train; one_step_off (rollout.layout=separate): batch k+1 is generated
    # with the weights of step k-1 while step k trains, token-level truncated IS on unless rollout_is is set;
    # streaming (rollout.layout=separate, rollout.mode=async): the rollout pool generates prompt groups
    # continuously and a step trains on the first data.train_batch_size groups to finish (truncated IS on)
    async_mode: AsyncMode = "synchronous"
    max_staleness: int = 1  # streaming, >= 0: a group generated more actor updates ago than this is dropped
    stream_queue_batches: int = 2  # streaming, >= 1: prompt batches in the pool or waiting to train
    worker_timeout_s: float = 1800.0  # SECONDS one worker-group call may take before the run stops, > 0
    progress_bar: bool = True  # a progress bar with the ETA on stderr
    # FLOP/s of one device in the training dtype, > 0, for perf/mfu/*; None = a table of known GPUs, or
    # torch.mm measured at start-up on a CPU (engine/flops.py)
    peak_flops: float | None = None
    profile: ProfileConfig = field(default_factory=ProfileConfig)  # torch.profiler traces of chosen steps
    # each training step's samples (texts, rewards, advantage, mismatch) as <dir>/<step>.jsonl; None = none.
    # A relative folder is relative to the current directory; config.yaml in the run folder holds it absolute
    rollout_data_dir: str | None = None
    validation_data_dir: str | None = None  # each validation pass's samples as <dir>/<step>.jsonl
    # >= 0: the first sample of the first N validation prompts, every pass, to each tracker that takes text
    log_val_generations: int = 0


@dataclass(frozen=True)
class Derived:
    """Sizes computed from a validated config. Units as in the schema: PROMPTS, SAMPLES, RANKS."""

    world_size: int  # RANKS: trainer.nnodes * trainer.workers_per_node
    dp_size: int  # RANKS the batch is split over: world_size / (model-parallel or sequence-parallel ranks)
    samples_per_step: int  # SAMPLES per training step, global: data.train_batch_size * rollout.n
    samples_per_rank: int  # SAMPLES per step on one data-parallel rank
    gen_prompts_per_round: int  # PROMPTS per generation round; data.train_batch_size unless dynamic sampling
    actor_mini_batch_samples: int  # SAMPLES per actor optimizer step, global
    actor_mini_batch_samples_per_rank: int  # SAMPLES per actor optimizer step on one rank
    actor_grad_accum_steps: int | None  # micro-batches per mini-batch; None with use_dynamic_bsz (varies)
    actor_mini_batches_per_step: int  # actor mini-batches per training step (one epoch)
    actor_optimizer_steps_per_step: int  # actor optimizer steps per training step (all epochs)
    critic_mini_batch_samples: int  # as the actor's; 0 when there is no critic
    critic_mini_batch_samples_per_rank: int
    critic_grad_accum_steps: int | None
    critic_mini_batches_per_step: int
    critic_optimizer_steps_per_step: int
    critic_needed: bool  # a critic is built and trained
    reference_needed: bool  # a reference model is loaded (KL loss or KL in reward)
    reward_model_needed: bool  # a reward model is loaded
    reward_baselines_needed: bool  # the estimator needs a baseline reward (ReMax: a greedy sample per prompt)
    # The actor makes ONE optimizer step on a step's samples (one mini-batch, one epoch) and nothing reads
    # old log-probs before it (no KL in the reward, no sum pi^2 for OTB, no bypass mode): they equal the update's own log-probs, detached, so
    # their separate forward pass is skipped (actor.old_log_probs_from_update).
    old_log_probs_from_update: bool
    ranks_why: str = field(default="", compare=False)  # how workers_per_node was chosen (start-up line)


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
    # Computed by validate_config(); never read from YAML and never written by config_to_dict().
    _derived: Derived | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def derived(self) -> Derived:
        """World size, samples per step, per-rank mini/micro-batches, which models are needed."""
        if self._derived is None:
            raise ConfigError(
                "cfg.derived is computed by validation: call validate_config(cfg) (load_config does)."
            )
        return self._derived
