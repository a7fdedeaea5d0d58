"""Which worker group hosts which role, built from the config (trainer.backend / placement).

- The actor, its rollout engine and the reference share one worker (the hybrid engine): the
  rollout is refreshed from the actor in process, and the reference reads the same inputs.
- trainer.placement=colocate: the critic and the reward model live in a second group on the SAME
  pool (each group takes half of every bundle: same GPUs / CPUs, separate processes).
  trainer.placement=separate: they get pools of their own, so they run beside the actor in time.
- rollout.layout=separate: the rollout engines are a group of their own on a pool of their own
  (rollout.nnodes x rollout.workers_per_node ranks); the actor's rank 0 sends them the weights over a
  WeightBus that spans both groups (`sync_rollout`).
- trainer.backend=inprocess: one worker in this process holds every role (world size 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tandem.config.derived import choose_device
from tandem.config.errors import ConfigError
from tandem.config.schema import NSIGHT_WORKER_OPTIONS, TandemConfig
from tandem.controller import ResourcePool, WorkerGroup, init_ray
from tandem.roles.worker import RoleWorker


@dataclass
class WorkerGroups:
    """The group that answers each role's calls (one group may answer several)."""

    actor: WorkerGroup  # actor + rollout (+ reference): generate, compute_log_probs, update_actor
    ref: WorkerGroup | None = None  # compute_ref_log_probs
    rollout: WorkerGroup | None = None  # generate: the actor's group, or the separate layout's own
    critic: WorkerGroup | None = None  # compute_values, update_critic
    reward_model: WorkerGroup | None = None  # compute_rm_scores
    pools: list[ResourcePool] = field(default_factory=list)

    def unique(self) -> list[WorkerGroup]:
        """Each group once, the actor's first."""
        groups = [self.actor, self.rollout, self.ref, self.critic, self.reward_model]
        out: list[WorkerGroup] = []
        for g in groups:
            if g is not None and all(g is not o for o in out):
                out.append(g)
        return out

    @property
    def separate_rollout(self) -> bool:
        return self.rollout is not None and self.rollout is not self.actor

    def sync_rollout(self, version: int = 0) -> None:
        """Separate layout: the actor's current weights into every rollout engine (both groups at once);
        ``version`` (the actor's update count) tags what the engines generate with them."""
        sending = self.actor.send_weights.async_()
        self.rollout.receive_weights(version)
        sending.result()

    def shutdown(self) -> None:
        for group in self.unique():
            group.shutdown()
        for pool in self.pools:
            pool.remove()


def device_choice(cfg: TandemConfig) -> tuple[str, str]:
    """(device, why) for trainer.device (config/derived.py `choose_device`): auto = cuda when the workers
    will have GPUs (this machine's for the in-process backend, the cluster's for Ray)."""
    if cfg.trainer.device != "auto":
        return choose_device(cfg.trainer.device, 0)
    if cfg.trainer.backend == "inprocess":
        import torch

        return choose_device("auto", torch.cuda.device_count())
    import ray

    return choose_device("auto", int(ray.cluster_resources().get("GPU", 0)), "in the Ray cluster")


def resolve_device(cfg: TandemConfig) -> str:
    """trainer.device, with auto resolved (see `device_choice`)."""
    return device_choice(cfg)[0]


PURPOSES = ("rl", "sft", "eval")


def nsight_options(cfg: TandemConfig, device: str) -> dict[str, str] | None:
    """Ray's runtime_env "nsight" for every worker under trainer.profile.tool=nsys (None otherwise). Nsight
    Systems records CUDA kernels, so a run whose workers have no GPU is refused here, before any starts."""
    prof = cfg.trainer.profile
    if prof.tool != "nsys" or not prof.steps:
        return None
    if device != "cuda":
        raise ConfigError(
            f"trainer.profile.tool=nsys profiles CUDA kernels with Nsight Systems, and this run's workers have "
            f"no GPU (trainer.device resolves to {device}); this is a hardware limit, not a setting. Use "
            "trainer.profile.tool=torch (torch.profiler traces) on this machine"
        )
    options = {**NSIGHT_WORKER_OPTIONS, **prof.nsight_options}
    # `nsys profile --NAME=VALUE` text: true / false as nsys spells them; None drops the option
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items() if v is not None}


def build_worker_groups(
    cfg: TandemConfig,
    total_training_steps: int | None = None,
    *,
    purpose: str = "rl",
    log_dir: str | Path | None = None,
) -> WorkerGroups:
    """Start the workers of every role the config needs; the caller owns `shutdown()`.

    purpose: rl = every role the config needs; sft = the actor alone; eval = the actor and its rollout.
    log_dir: where the Ray workers' output goes (one file per rank) instead of the console.
    """
    d, t = cfg.derived, cfg.trainer
    if purpose not in PURPOSES:
        raise ValueError(f"build_worker_groups: purpose must be one of {PURPOSES}, got {purpose!r}")
    hybrid, others = ["actor"], []
    separate = cfg.rollout.layout == "separate" and purpose != "sft"
    if purpose != "sft" and not separate:
        hybrid.append("rollout")
    if purpose == "rl":
        hybrid += ["ref"] if d.reference_needed else []
        others = (["critic"] if d.critic_needed else []) + (["reward_model"] if d.reward_model_needed else [])
    args = (cfg,)
    kwargs = {"total_training_steps": total_training_steps}

    def has(role: str, group: WorkerGroup | None) -> WorkerGroup | None:
        return group if role in hybrid + others else None

    if t.backend == "inprocess":
        device = resolve_device(cfg)
        nsight_options(cfg, device)  # the hardware check; the user runs this process under nsys
        group = WorkerGroup.inprocess(
            RoleWorker, name="all_roles", args=(cfg, hybrid + others), kwargs=kwargs, device=device
        )
        rollout = group if purpose != "sft" else None
        return WorkerGroups(
            group, has("ref", group), rollout, has("critic", group), has("reward_model", group)
        )

    init_ray(address=t.ray_address)
    device = resolve_device(cfg)
    nsight = nsight_options(cfg, device)
    # every group: its ranks' log files, the key a call's timeout message names, Nsight for tool=nsys, and on
    # a CPU this process's param_dtype=auto choice (the one the device line printed: engine/auto_dtype.py)
    logs = {
        "log_dir": None if log_dir is None else str(log_dir),
        "call_timeout_name": "trainer.worker_timeout_s",
        "nsight": nsight,
        "env": _cpu_dtype_env() if device == "cpu" else None,
    }
    gpus = 1 if device == "cuda" else 0

    def pool(name: str) -> ResourcePool:
        return ResourcePool(t.nnodes, t.workers_per_node, t.cpus_per_worker, gpus, name=name)

    groups = WorkerGroups(actor=None)  # type: ignore[arg-type]  # filled in below
    try:
        main = pool("main")
        groups.pools.append(main)
        share = 0.5 if others and t.placement == "colocate" else 1.0
        groups.actor = WorkerGroup.ray(
            RoleWorker,
            main,
            name="_".join(hybrid),
            args=(*args, hybrid),
            kwargs=kwargs,
            share=share,
            call_timeout_s=t.worker_timeout_s,
            **logs,
        )
        groups.ref = has("ref", groups.actor)
        groups.rollout = groups.actor if "rollout" in hybrid else None
        if separate:
            groups.rollout = _separate_rollout(cfg, groups, args, kwargs, gpus, logs)
        if t.placement == "colocate" and others:
            side = WorkerGroup.ray(
                RoleWorker,
                main,
                name="_".join(others),
                args=(*args, others),
                kwargs=kwargs,
                share=0.5,
                call_timeout_s=t.worker_timeout_s,
                **logs,
            )
            groups.critic, groups.reward_model = has("critic", side), has("reward_model", side)
        else:
            for role in others:
                own = pool(role)
                groups.pools.append(own)
                group = WorkerGroup.ray(
                    RoleWorker,
                    own,
                    name=role,
                    args=(*args, [role]),
                    kwargs=kwargs,
                    call_timeout_s=t.worker_timeout_s,
                    **logs,
                )
                setattr(groups, role, group)
    except BaseException:
        groups.shutdown()  # the groups started so far, then every pool
        raise
    return groups


def _cpu_dtype_env() -> dict[str, str]:
    from tandem.engine.auto_dtype import worker_env  # torch: not imported by the command line's quick paths

    return worker_env()


def _separate_rollout(
    cfg: TandemConfig,
    groups: WorkerGroups,
    args: tuple,
    kwargs: dict,
    gpus: int,
    logs: dict,
) -> WorkerGroup:
    """The rollout engines' own pool and group, joined to the actor's rank 0 by a WeightBus."""
    r, t = cfg.rollout, cfg.trainer
    pool = ResourcePool(r.nnodes, r.workers_per_node, t.cpus_per_worker, gpus, name="rollout")
    groups.pools.append(pool)
    group = WorkerGroup.ray(
        RoleWorker,
        pool,
        name="rollout",
        args=(*args, ["rollout"]),
        kwargs=kwargs,
        call_timeout_s=t.worker_timeout_s,
        **logs,
    )
    groups.rollout = group  # shut down with the rest if joining fails
    address = groups.actor.weight_bus_address()[0]
    bus = (address, 1 + group.world_size, r.weight_bucket_mb << 20, t.worker_timeout_s)
    joining = groups.actor.join_weight_bus.async_(*bus)
    group.join_weight_bus(*bus)
    joining.result()
    return group
