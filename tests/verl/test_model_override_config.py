"""verl's model.override_config in RL runs: the attributes set on the Hugging Face config of the actor, the
reference and the rollout engine (actor_rollout_ref.model.override_config) and of the critic (its own
critic.model.override_config, as in verl), read back from the built models; refused by name where an engine
cannot build them."""

from __future__ import annotations

import pytest
import torch

from roles.roles_helpers import PROMPTS, prompt_batch, tiny_config  # tests/ is on sys.path (pytest's rootdir)
from tandem.config import load_config
from tandem.config.errors import ConfigError
from tandem.controller import WorkerGroup
from tandem.models.tiny import save_tiny
from tandem.roles.worker import RoleWorker
from tandem.rollout import SamplingParams
from tandem.trainer.start_checks.available import check_available
from tandem.trainer.start_checks.training_engine import model_override_problems

ACTOR = "+actor_rollout_ref.model.override_config"
CRITIC = "+critic.model.override_config"


def _cfg(*overrides: str):
    return load_config("ppo", ["trainer.device=cpu", *overrides], on_verl=lambda t: None)


def test_verl_keys_fill_each_models_override_config_and_attention_kernel():
    cfg = _cfg(
        f"{ACTOR}.attention_dropout=0.",
        f"{ACTOR}.model_config.rms_norm_eps=0.001",  # verl's megatron nesting, read through
        f"{ACTOR}.attn_implementation=eager",
        f"{CRITIC}.resid_pdrop=0.",
        f"{CRITIC}.rope_scaling.type=yarn",
        f"{CRITIC}.rope_scaling.factor=4.0",
        f"{CRITIC}.attn_implementation=sdpa",
    )
    assert cfg.actor.override_config == {"attention_dropout": 0.0, "rms_norm_eps": 0.001}
    assert cfg.actor.fsdp.attn_implementation == "eager"
    assert cfg.critic.override_config == {"resid_pdrop": 0.0, "rope_scaling": {"type": "yarn", "factor": 4.0}}
    assert cfg.critic.attn_implementation == "sdpa"
    # the whole mapping at once, as a verl YAML or Hydra's {k:v} gives it
    whole = _cfg(f"{ACTOR}={{attention_dropout:0.,attn_implementation:eager}}", f"{CRITIC}={{embd_pdrop:0.}}")
    assert whole.actor.override_config == {"attention_dropout": 0.0}
    assert whole.actor.fsdp.attn_implementation == "eager"
    assert whole.critic.override_config == {"embd_pdrop": 0.0} and whole.critic.attn_implementation is None


def test_what_an_engine_cannot_build_is_refused_at_start_naming_the_key():
    megatron = _cfg(f"{ACTOR}.rms_norm_eps=0.001", f"{CRITIC}.rms_norm_eps=0.001", "actor.strategy=megatron")
    problems = model_override_problems(megatron)
    assert len(problems) == 2
    assert problems[0].startswith("actor.override_config is applied by the FSDP2 engine")
    assert problems[1].startswith("critic.override_config is applied by the FSDP2 engine")
    cuda_only = _cfg(f"{ACTOR}.attn_implementation=flash_attention_2", f"{CRITIC}.attn_implementation=varlen")
    assert model_override_problems(cuda_only) == [
        "actor.fsdp.attn_implementation=flash_attention_2 runs on CUDA only and trainer.device=cpu; set "
        "actor.fsdp.attn_implementation=sdpa (or sdpa_split, eager)",
        "critic.attn_implementation=varlen runs on CUDA only and trainer.device=cpu; set "
        "critic.attn_implementation=sdpa (or sdpa_split, eager)",
    ]
    with pytest.raises(
        ConfigError, match="actor.fsdp.attn_implementation=flash_attention_2 runs on CUDA only"
    ):
        check_available(cuda_only)
    # in Tandem's own keys the kernel is its setting, not a config attribute
    tandem = _cfg("actor.override_config.attn_implementation=eager")
    assert "the attention kernel is actor.fsdp.attn_implementation" in model_override_problems(tandem)[0]
    assert model_override_problems(_cfg(f"{ACTOR}.rms_norm_eps=0.001")) == []


def _epsilons(model: torch.nn.Module) -> set[float]:
    return {m.variance_epsilon for m in model.modules() if type(m).__name__.endswith("RMSNorm")}


@pytest.mark.timeout(300)
def test_the_overrides_reach_the_built_actor_reference_critic_and_rollout(tmp_path):
    """Read back from the models one in-process worker builds: the actor, the reference and the HF rollout carry
    the actor's overrides, the critic its own; the rollout's log-probs equal the actor's (the same model)."""
    model = save_tiny(tmp_path / "model")
    cfg = tiny_config(
        model,
        1,
        "algorithm.adv_estimator=gae",
        "actor.use_kl_loss=true",
        "rollout.engine=hf",
        f"{ACTOR}.rms_norm_eps=0.25",  # large: a rollout built without it would sample from another model
        f"{ACTOR}.attention_dropout=0.",
        f"{ACTOR}.attn_implementation=eager",
        f"{CRITIC}.rms_norm_eps=0.125",
        f"{CRITIC}.attn_implementation=sdpa",
    )
    group = WorkerGroup.inprocess(
        RoleWorker, name="override", args=(cfg, ["actor", "ref", "critic", "rollout"])
    )
    try:
        worker = group._backend.worker
        actor, reference = worker.actor.engine.model, worker.reference.engine.model
        critic, rollout = worker.critic.engine.model, worker.rollout.engine.model
        for built in (actor, reference, rollout):
            assert built.config.rms_norm_eps == 0.25 and _epsilons(built) == {0.25}
            assert built.config.attention_dropout == 0.0
        assert actor.config._attn_implementation == reference.config._attn_implementation == "eager"
        assert critic.config.rms_norm_eps == 0.125 and _epsilons(critic) == {0.125}
        assert critic.config._attn_implementation == "sdpa"  # its own kernel (unset: the actor's)
        out = group.generate(prompt_batch(PROMPTS[:2]), SamplingParams(max_tokens=6, n=2, seed=3))
        recomputed = group.compute_log_probs(out, False)["old_log_probs"]
        mask = out["response_mask"] != 0
        assert float((recomputed - out["rollout_log_probs"]).abs()[mask].max()) < 1e-4
    finally:
        group.shutdown()
