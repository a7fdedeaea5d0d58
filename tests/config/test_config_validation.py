"""Each start-up rule fires, names its keys and says what to do."""

import pytest
from config_helpers import error_of, load

from tandem.config import ConfigError, TandemConfig, config_to_dict, load_config, validate_config

RULES = [
    # (overrides, words the message must contain)
    (
        ["data.train_batch_size=6", "actor.ppo_mini_batch_size=4"],
        ["actor.ppo_mini_batch_size=4 does not divide data.train_batch_size=6", "1, 2, 3, 6"],
    ),
    (
        [
            "data.train_batch_size=3",
            "actor.ppo_mini_batch_size=3",
            "rollout.n=3",
            "trainer.workers_per_node=2",
        ],
        ["data.train_batch_size=3 prompts x rollout.n=3 = 9 samples per step", "2 data-parallel ranks"],
    ),
    (
        [
            "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=1",
            "rollout.n=3",
            "trainer.workers_per_node=2",
        ],
        [
            "actor mini-batch of actor.ppo_mini_batch_size=1 prompts x rollout.n=3 = 3 samples",
            "multiple of 2",
        ],
    ),
    (
        ["actor.micro_batch_size_per_rank=3", "actor.use_dynamic_bsz=false", "trainer.workers_per_node=1"],
        [
            "actor.micro_batch_size_per_rank=3 does not divide the per-rank mini-batch of 16 samples",
            "1, 2, 4, 8, 16",
            "actor.use_dynamic_bsz=true",
        ],
    ),
    (
        ["algorithm.adv_estimator=gae", "critic.enable=false", "rollout.n=1"],
        ["algorithm.adv_estimator=gae needs a value model but critic.enable=false", "critic.enable=auto"],
    ),
    (
        ["algorithm.adv_estimator=grpo_passk", "rollout.n=1"],
        [
            "algorithm.adv_estimator=grpo_passk",
            "rollout.n=1",
            "every advantage would be 0",
            "Set rollout.n>=2",
        ],
    ),
    (["actor.clip_ratio_c=1.0"], ["actor.clip_ratio_c=1.0 must be > 1"]),
    (
        ["algorithm.adv_estimator=grpp"],
        ["algorithm.adv_estimator: 'grpp' is not a known advantage estimator. Did you mean 'grpo'?"],
    ),
    (["actor.policy_loss=vanila"], ["actor.policy_loss: 'vanila' is not a known policy loss", "'vanilla'"]),
    (
        ["actor.policy_loss=dro"],
        ["actor.policy_loss=dro needs actor.dro_beta", "set e.g. actor.dro_beta=0.1"],
    ),
    (["actor.policy_loss=dro", "actor.dro_beta=0"], ["actor.dro_beta=0.0 must be > 0"]),
    (["actor.clip_cov_lb=6"], ["actor.clip_cov_lb=6.0 must be below actor.clip_cov_ub=5.0"]),
    (["actor.clip_cov_ratio=0"], ["actor.clip_cov_ratio=0.0 must be in (0, 1]"]),
    (["actor.kl_cov_ratio=2"], ["actor.kl_cov_ratio=2.0 must be in (0, 1]"]),
    (["actor.ppo_kl_coef=-1"], ["actor.ppo_kl_coef=-1.0 must be >= 0"]),
    (["rollout.layout=apart"], ["rollout.layout", "hybrid", "separate"]),
    (["rollout.workers_per_node=0"], ["rollout.workers_per_node=0 must be >= 1"]),
    (["rollout.weight_bucket_mb=0"], ["rollout.weight_bucket_mb=0 must be >= 1"]),
    (
        ["rollout.layout=separate", "trainer.backend=inprocess"],
        ["rollout.layout=separate puts the rollout engines", "use trainer.backend=ray"],
    ),
    (
        ["trainer.async_mode=one_step_off"],
        ["needs the rollout engines in a pool of their own", "rollout.layout=separate"],
    ),
    (
        ["trainer.async_mode=streaming"],
        ["trainer.async_mode=streaming generates while", "rollout.layout=separate", "set rollout.mode=async"],
    ),
    (["trainer.max_staleness=-1"], ["trainer.max_staleness=-1 must be >= 0"]),
    (["trainer.stream_queue_batches=0"], ["trainer.stream_queue_batches=0 must be >= 1"]),
    (
        [
            "trainer.async_mode=one_step_off",
            "rollout.layout=separate",
            "algorithm.dynamic_sampling.enable=true",
        ],
        ["dynamic sampling's extra rounds are not supported", "trainer.async_mode=synchronous"],
    ),
    (
        ["trainer.async_mode=one_step_off", "rollout.layout=separate", "algorithm.adv_estimator=remax"],
        ["generates a greedy baseline each step", "trainer.async_mode=synchronous"],
    ),
    (["actor.loss_agg_mode=token_mean"], ["actor.loss_agg_mode: 'token_mean'", "'token-mean'"]),
    (["critic.loss_agg_mode=seq-mean"], ["critic.loss_agg_mode: 'seq-mean' is not a known loss aggregation"]),
    (["actor.kl_loss_type=lowvar_kl"], ["actor.kl_loss_type: 'lowvar_kl'", "'low_var_kl'"]),
    (["algorithm.kl_penalty=k4"], ["algorithm.kl_penalty: 'k4' is not a known KL estimator"]),
    (["algorithm.kl_ctrl.type=adaptiv"], ["algorithm.kl_ctrl.type: 'adaptiv'", "'adaptive'"]),
    (["rollout.is_correction=tokens"], ["rollout.is_correction: 'tokens'", "Known: none, sequence, token"]),
    (
        ["reward.overlong.enable=true", "reward.overlong.buffer_len=512", "data.max_response_length=512"],
        ["reward.overlong.buffer_len=512 must be > 0 and below data.max_response_length=512"],
    ),
    (["rollout.temperature=0"], ["rollout.temperature=0.0: training rollouts must sample"]),
    (["rollout.val.n=4"], ["rollout.val.n=4 with rollout.val.temperature=0"]),
    (
        ["actor.strategy=megatron", "actor.megatron.tensor_parallel=3", "trainer.workers_per_node=4"],
        [
            "actor.megatron tensor_parallel=3 x pipeline_parallel=1 x context_parallel=1 = 3 does not divide the "
            "world size 4"
        ],
    ),
    (
        ["actor.strategy=megatron", "actor.megatron.expert_parallel=3", "trainer.workers_per_node=4"],
        ["actor.megatron.expert_parallel=3 does not divide"],
    ),
    (
        ["actor.strategy=megatron", "actor.megatron.virtual_pipeline=2", "trainer.workers_per_node=2"],
        ["actor.megatron.virtual_pipeline=2 needs actor.megatron.pipeline_parallel > 1"],
    ),
    (
        ["actor.fsdp.sequence_parallel=3", "trainer.workers_per_node=4"],
        ["actor.fsdp.sequence_parallel=3 does not divide the world size 4"],
    ),
    (
        ["rollout.engine=vllm", "rollout.tensor_parallel=4", "trainer.workers_per_node=2"],
        ["rollout.tensor_parallel=4 does not divide the world size 2"],
    ),
    (
        ["rollout.engine=hf", "rollout.tensor_parallel=2", "trainer.workers_per_node=2"],
        ["rollout.engine=hf generates on each rank"],
    ),
    (["rollout.engine=sglang", "trainer.device=cpu"], ["rollout.engine=sglang has no CPU path"]),
    (
        [
            "algorithm.dynamic_sampling.enable=true",
            "algorithm.adv_estimator=reinforce_plus_plus",
            "rollout.n=1",
        ],
        ["algorithm.dynamic_sampling.enable=true", "rollout.n=1"],
    ),
    (["trainer.critic_warmup=5"], ["trainer.critic_warmup=5 but there is no critic"]),
    (
        ["actor.use_dynamic_bsz=true", "actor.max_tokens_per_micro_batch=100"],
        ["actor.max_tokens_per_micro_batch=100 cannot hold one full-length sample", "at least 1024"],
    ),
    (
        ["reward.reward_model.enable=true"],
        ["reward.reward_model.enable=true needs reward.reward_model.model_path"],
    ),
    (["reward.format.enable=true", "reward.format.pattern=(unclosed"], ["reward.format.pattern="]),
    (["trainer.save_freq=0"], ["trainer.save_freq=0: use a number of steps >= 1, or -1 for never"]),
    (["rollout.top_k=0"], ["rollout.top_k=0"]),
    (["rollout.top_p=1.5"], ["rollout.top_p=1.5 must be in (0, 1]"]),
    (["actor.optim.lr=0"], ["actor.optim.lr=0.0 must be > 0"]),
    (["critic.optim.betas=[0.9,1.0]"], ["critic.optim.betas[1]=1.0 must be in [0, 1)"]),
    (["actor.grad_clip=0"], ["actor.grad_clip=0.0 must be > 0; use null for no clipping"]),
    (["trainer.workers_per_node=0"], ["trainer.workers_per_node=0 must be >= 1"]),
    (
        ["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0"],
        ["algorithm.kl_ctrl.target_kl=0.0"],
    ),
    (
        ["reward.custom_reward_file=/no/such/file.py"],
        ["reward.custom_reward_file: '/no/such/file.py' does not exist"],
    ),
    (["trainer.resume=/no/such/ckpt"], ["trainer.resume='/no/such/ckpt' is not a checkpoint path"]),
]


@pytest.mark.parametrize(("overrides", "needles"), RULES, ids=[r[0][-1] for r in RULES])
def test_rule_fires_with_its_keys(overrides, needles):
    msg = error_of(*overrides)
    for needle in needles:
        assert needle in msg


def test_critic_auto_follows_the_estimator():
    ppo = load("algorithm.adv_estimator=gae", "rollout.n=1", "data.train_batch_size=8")
    assert ppo.critic.enable is True and ppo.derived.critic_needed
    assert load().critic.enable is False  # default estimator grpo


def test_critic_inherits_actor_settings():
    cfg = load("actor.model_path=/m", "actor.ppo_mini_batch_size=2", "algorithm.adv_estimator=gae")
    assert cfg.critic.model_path == "/m"
    assert (cfg.critic.ppo_mini_batch_size, cfg.critic.micro_batch_size_per_rank, cfg.critic.ppo_epochs) == (
        2,
        2,
        1,
    )
    assert cfg.critic.optim.lr == 1e-5  # the critic keeps its own optimizer defaults
    kept = load("critic.ppo_mini_batch_size=8", "algorithm.adv_estimator=gae")
    assert kept.critic.ppo_mini_batch_size == 8


def test_tokenizer_paths_default_to_the_model_folders():
    cfg = load("actor.model_path=/m")
    assert (cfg.actor.tokenizer_path, cfg.critic.tokenizer_path, cfg.reward.reward_model.tokenizer_path) == (
        None,
        None,
        None,
    )
    # The critic on the actor's folder reads the actor's tokenizer, wherever that is...
    cfg = load("actor.model_path=/m", "actor.tokenizer_path=/t")
    assert (cfg.critic.model_path, cfg.critic.tokenizer_path) == ("/m", "/t")
    # ... and one with a folder of its own, that folder's (None), unless told otherwise.
    cfg = load("actor.model_path=/m", "actor.tokenizer_path=/t", "critic.model_path=/c")
    assert (cfg.critic.model_path, cfg.critic.tokenizer_path) == ("/c", None)
    cfg = load(
        "actor.tokenizer_path=/t", "critic.tokenizer_path=/ct", "reward.reward_model.tokenizer_path=/rt"
    )
    assert (cfg.critic.tokenizer_path, cfg.reward.reward_model.tokenizer_path) == ("/ct", "/rt")
    assert config_to_dict(load("actor.tokenizer_path=/t"))["actor"]["tokenizer_path"] == "/t"


def test_critic_batch_rules_apply_only_with_a_critic():
    assert load("critic.micro_batch_size_per_rank=3").critic.enable is False
    msg = error_of(
        "critic.micro_batch_size_per_rank=3", "algorithm.adv_estimator=gae", "actor.use_dynamic_bsz=false"
    )
    assert "critic.micro_batch_size_per_rank=3 does not divide" in msg


def test_dynamic_bsz_skips_the_micro_batch_rule():
    cfg = load("actor.micro_batch_size_per_rank=3", "actor.use_dynamic_bsz=true")
    assert cfg.derived.actor_grad_accum_steps is None


def test_require_data_wants_files_and_a_model():
    cfg_args = (None, ["trainer.test_freq=5"])
    load_config(*cfg_args)  # fine without the flag
    with pytest.raises(ConfigError) as info:
        load_config(*cfg_args, require_data=True)
    msg = str(info.value)
    assert "data.train_files is empty" in msg
    assert "data.val_files is empty" in msg
    assert "actor.model_path is not set" in msg


def test_require_data_checks_files_exist(tmp_path):
    train = tmp_path / "train.parquet"
    train.write_bytes(b"")
    overrides = [f"data.train_files=[{train},{tmp_path}/missing.jsonl]", f"actor.model_path={tmp_path}"]
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides, require_data=True)
    err = info.value
    assert len(err.problems) == 1 and "missing.jsonl' does not exist" in err.problems[0]
    load_config(None, [f"data.train_files=[{train}]", f"actor.model_path={tmp_path}"], require_data=True)


def test_programmatic_config_validates_and_derives():
    cfg = TandemConfig()
    with pytest.raises(ConfigError, match=r"call validate_config\(cfg\)"):
        _ = cfg.derived
    cfg.rollout.n = 0
    with pytest.raises(ConfigError, match="rollout.n"):
        validate_config(cfg)
    cfg.rollout.n = 2
    assert validate_config(cfg).derived.samples_per_step == 16


def test_real_registries_know_the_agreed_names(real_registries):
    for name in [
        "gae",
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "opo",
        "gpg",
    ]:
        info = real_registries["adv"].info(name)
        assert {"needs_critic", "needs_groups", "needs_reward_baselines"} <= set(info)
    assert real_registries["adv"].info("gae")["needs_critic"] is True
    assert real_registries["adv"].info("grpo")["needs_groups"] is True
    assert real_registries["adv"].info("remax")["needs_reward_baselines"] is True
    for key, names in [
        ("loss", ["vanilla", "gspo", "reinforce"]),
        ("ctrl", ["fixed", "adaptive"]),
        ("is", ["token", "sequence"]),
        ("kl", ["kl", "low_var_kl", "k3", "low_var_kl+"]),
        ("agg", ["token-mean", "seq-mean-token-sum-norm"]),
    ]:
        assert set(names) <= set(real_registries[key].names())


def test_real_registries_catch_a_bad_name(real_registries):
    assert "is not a known advantage estimator" in error_of("algorithm.adv_estimator=grpp")
    assert load("algorithm.adv_estimator=gae", "rollout.n=1").derived.critic_needed


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_the_token_baseline_needs_sum_pi_squared_and_the_old_log_prob_pass(real_registries, estimator):
    message = error_of(f"algorithm.adv_estimator={estimator}")
    assert (
        "actor.calculate_sum_pi_squared" in message and "set actor.calculate_sum_pi_squared=true" in message
    )
    one_step = "actor.ppo_mini_batch_size=8"  # = data.train_batch_size: one optimizer step per step
    cfg = load(f"algorithm.adv_estimator={estimator}", "actor.calculate_sum_pi_squared=true", one_step)
    assert load(one_step).derived.old_log_probs_from_update  # one step skips the pass ...
    assert not cfg.derived.old_log_probs_from_update  # ... which computes sum pi^2 before the advantages


SIX_RANKS = ["trainer.nnodes=3", "trainer.workers_per_node=2", "rollout.n=5"]


def test_three_nodes_of_two_mini_batch_not_a_multiple_of_the_ranks():
    msg = error_of(*SIX_RANKS, "data.train_batch_size=12", "actor.ppo_mini_batch_size=4")
    assert "actor.ppo_mini_batch_size=4 prompts x rollout.n=5 = 20 samples does not split evenly" in msg
    assert "6 data-parallel ranks (trainer.nnodes x trainer.workers_per_node = 6)" in msg
    assert "Make actor.ppo_mini_batch_size * rollout.n a multiple of 6" in msg


def test_three_nodes_of_two_step_not_a_multiple_of_the_ranks():
    msg = error_of(*SIX_RANKS, "data.train_batch_size=3", "actor.ppo_mini_batch_size=3")
    assert "data.train_batch_size=3 prompts x rollout.n=5 = 15 samples per step does not split evenly" in msg


def test_inherited_critic_sizes_are_not_reported_twice():
    err = error_of(
        "algorithm.adv_estimator=gae",
        "rollout.n=1",
        "actor.micro_batch_size_per_rank=3",
        "actor.use_dynamic_bsz=false",
    )
    assert "actor.micro_batch_size_per_rank=3 does not divide" in err
    assert "critic.micro_batch_size_per_rank" not in err


def test_dynamic_bsz_budget_must_hold_one_full_sample():
    msg = error_of("actor.use_dynamic_bsz=true", "actor.max_tokens_per_micro_batch=255", preset="base")
    assert "actor.max_tokens_per_micro_batch=255 cannot hold one full-length sample" in msg
    assert "256 tokens). Raise it to at least 256" in msg


def test_dynamic_sampling_rounds_that_can_never_fill_a_step():
    msg = error_of(
        "algorithm.dynamic_sampling.gen_batch_size=2",
        "algorithm.dynamic_sampling.max_num_gen_batches=3",
        preset="dapo",
    )
    assert "3 rounds (max_num_gen_batches) x 2 prompts (gen_batch_size) cannot fill a step of " in msg
    assert "data.train_batch_size=8 prompts" in msg
    # several small rounds that can add up are fine, and so is no limit
    load(
        "algorithm.dynamic_sampling.gen_batch_size=4",
        "algorithm.dynamic_sampling.max_num_gen_batches=2",
        preset="dapo",
    )
    load(
        "algorithm.dynamic_sampling.gen_batch_size=2",
        "algorithm.dynamic_sampling.max_num_gen_batches=0",
        preset="dapo",
    )


def test_runtime_placement_rules():
    msg = error_of("trainer.backend=inprocess", "trainer.workers_per_node=2")
    assert "trainer.backend=inprocess runs one rank" in msg and "trainer.workers_per_node=1" in msg
    assert "trainer.cpus_per_worker=0" in error_of("trainer.cpus_per_worker=0")
    assert "trainer.worker_timeout_s=0" in error_of("trainer.worker_timeout_s=0")
    cfg = load("trainer.backend=inprocess", "trainer.workers_per_node=1", "trainer.placement=separate")
    assert (cfg.trainer.backend, cfg.trainer.placement) == ("inprocess", "separate")
    assert "trainer.placement: got 'spread', expected one of 'colocate', 'separate'" in error_of(
        "trainer.placement=spread"
    )


def test_streaming_validates_and_turns_truncated_is_on():
    cfg = load("trainer.async_mode=streaming", "rollout.layout=separate", "rollout.mode=async")
    assert cfg.algorithm.rollout_correction.rollout_is == "token"
    assert (cfg.trainer.max_staleness, cfg.trainer.stream_queue_batches) == (1, 2)
