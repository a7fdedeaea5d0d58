"""What the runtime derives from the settings, decided once: the batch sizes (`compute_derived`), the
device that trainer.device=auto means (`choose_device`) and the ranks per node that workers_per_node=auto
means (`choose_workers_per_node`).

Workers read the sizes instead of recomputing `train_batch_size * n // world_size` themselves.
The `Derived` dataclass that holds them is plain data in schema.py; validation sets `cfg.derived`.
"""

from __future__ import annotations

from tandem.algo_options import EstimatorSpec
from tandem.config.schema import Derived, TandemConfig
from tandem.train_engine_options import model_parallel_size


def data_parallel_size(cfg: TandemConfig) -> tuple[int, int]:
    """(world size, data-parallel size); the latter is 0 when the parallel sizes do not divide."""
    world = cfg.trainer.nnodes * cfg.trainer.workers_per_node
    model_parallel = model_parallel_size(cfg.actor)  # megatron: tensor x pipeline x context; fsdp: Ulysses
    if model_parallel <= 0 or world % model_parallel:
        return world, 0
    return world, world // model_parallel


def choose_device(setting: str, gpus: int, where: str = "found") -> tuple[str, str]:
    """(device, why) for trainer.device=`setting` when the workers can see `gpus` GPUs (`where`: how they
    were counted, e.g. "in the Ray cluster"): auto = cuda when there is one, else cpu. The caller counts
    the GPUs, so the choice is testable without one."""
    if setting != "auto":
        return setting, "set by trainer.device"
    if gpus > 0:
        return "cuda", f"auto: {gpus} GPU{'s' if gpus > 1 else ''} {where}"
    return "cpu", f"auto: no GPU {where}"


CPU_RANKS = 2  # trainer.workers_per_node=auto without a GPU: two processes, what the CPU presets always ran


def choose_workers_per_node(
    trainer: int | str,
    rollout: int | str,
    *,
    gpus_per_node: int,
    where: str = "found",
    device: str = "auto",
    backend: str = "ray",
    separate: bool = False,
    rollout_tensor_parallel: int = 1,
) -> tuple[int, int, str]:
    """(trainer ranks per node, rollout ranks per node, why) for trainer.workers_per_node / rollout.workers_per_node
    `trainer` / `rollout` (a number or auto) when each node has `gpus_per_node` GPUs (`where`: how they were
    counted, e.g. "per node in the Ray cluster"). The caller counts the GPUs, so the choice is testable without one.

    auto: every GPU of a node for the trainer; in the separate layout (`separate`) the rollout pool shares the
    nodes: it takes half of them (a multiple of rollout.tensor_parallel) or what a numbered trainer leaves, the
    trainer the rest. Without a GPU (or with trainer.device=cpu): 2 trainer ranks and 1 rollout rank; with
    trainer.backend=inprocess, 1 of each.
    """
    rollout_alone = (
        1 if rollout == "auto" else int(rollout)
    )  # the hybrid layout has no rollout pool of its own
    if trainer != "auto" and (rollout != "auto" or not separate):
        return int(trainer), rollout_alone, "set by trainer.workers_per_node"
    gpus = 0 if device == "cpu" else gpus_per_node
    if backend == "inprocess" or gpus <= 0:
        why = (
            "auto: 1 rank in process"
            if backend == "inprocess"
            else f"auto: no GPU {where}, {CPU_RANKS} CPU ranks"
        )
        ranks = 1 if backend == "inprocess" else CPU_RANKS
        return (ranks if trainer == "auto" else int(trainer)), rollout_alone, why
    plural = "s" if gpus > 1 else ""
    if not separate:
        n = gpus if trainer == "auto" else int(trainer)
        return n, rollout_alone, f"auto: {gpus} GPU{plural} per node {where}"
    if rollout == "auto":
        tp = max(1, rollout_tensor_parallel)
        share = gpus - int(trainer) if trainer != "auto" else (gpus // 2) // tp * tp
        rollout = max(tp, share)
    trainer = max(1, gpus - int(rollout)) if trainer == "auto" else int(trainer)
    why = f"auto: {gpus} GPU{plural} per node {where}, {trainer} for training and {rollout} for the rollout pool"
    return trainer, int(rollout), why


def gen_prompts_per_round(cfg: TandemConfig) -> int:
    """PROMPTS generated per round: dynamic sampling's gen_batch_size when it is on, else one step's."""
    ds = cfg.algorithm.dynamic_sampling
    return (ds.gen_batch_size or cfg.data.train_batch_size) if ds.enable else cfg.data.train_batch_size


def compute_derived(cfg: TandemConfig, *, estimator: EstimatorSpec, ranks_why: str = "") -> Derived:
    """Sizes of a config that passed validation (so every division below is exact); `ranks_why`: how the
    ranks per node were chosen (`choose_workers_per_node`)."""
    world, dp = data_parallel_size(cfg)
    n = cfg.rollout.n
    samples = cfg.data.train_batch_size * n
    actor = _update_sizes(
        cfg.data.train_batch_size,
        cfg.actor.ppo_mini_batch_size,
        n,
        dp,
        cfg.actor.micro_batch_size_per_rank,
        cfg.actor.use_dynamic_bsz,
        cfg.actor.ppo_epochs,
    )
    critic_needed = cfg.critic.enable is True
    if critic_needed:
        critic = _update_sizes(
            cfg.data.train_batch_size,
            cfg.critic.ppo_mini_batch_size,
            n,
            dp,
            cfg.critic.micro_batch_size_per_rank,
            cfg.actor.use_dynamic_bsz,
            cfg.critic.ppo_epochs,
        )
    else:
        critic = (0, 0, 0, 0, 0)
    return Derived(
        world_size=world,
        dp_size=dp,
        samples_per_step=samples,
        samples_per_rank=samples // dp,
        gen_prompts_per_round=gen_prompts_per_round(cfg),
        actor_mini_batch_samples=actor[0],
        actor_mini_batch_samples_per_rank=actor[1],
        actor_grad_accum_steps=actor[2],
        actor_mini_batches_per_step=actor[3],
        actor_optimizer_steps_per_step=actor[4],
        critic_mini_batch_samples=critic[0],
        critic_mini_batch_samples_per_rank=critic[1],
        critic_grad_accum_steps=critic[2],
        critic_mini_batches_per_step=critic[3],
        critic_optimizer_steps_per_step=critic[4],
        critic_needed=critic_needed,
        reference_needed=cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward,
        reward_model_needed=cfg.reward.reward_model.enable,
        reward_baselines_needed=estimator.needs_reward_baselines,
        old_log_probs_from_update=cfg.actor.old_log_probs_from_update
        and actor[4] == 1
        and not cfg.algorithm.use_kl_in_reward
        and not cfg.actor.calculate_sum_pi_squared
        and not cfg.algorithm.rollout_correction.bypass_mode,
        ranks_why=ranks_why,
    )


def _update_sizes(
    prompts: int,
    mini_prompts: int | None,
    n: int,
    dp: int,
    micro: int | None,
    dynamic: bool,
    epochs: int | None,
) -> tuple[int, int, int | None, int, int]:
    assert mini_prompts is not None and micro is not None and epochs is not None  # filled in by resolve
    mini_samples = mini_prompts * n
    per_rank = mini_samples // dp
    grad_accum = None if dynamic else per_rank // micro
    mini_batches = prompts // mini_prompts
    return mini_samples, per_rank, grad_accum, mini_batches, mini_batches * epochs
