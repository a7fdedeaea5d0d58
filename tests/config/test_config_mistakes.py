"""The mistakes people coming from verl and TRL make, and the message each one gets.

Every message names the key (or file and line) and says what to write instead.
"""

import pytest
from config_helpers import error_of, load

from tandem.cli import main
from tandem.config import ConfigError, load_config, validate_config


def cli_error(capsys, *argv: str) -> str:
    assert main(["config", *argv]) == 2
    return capsys.readouterr().err


# --- command line -------------------------------------------------------------------------------


def test_cli_misspelt_section(capsys):
    err = cli_error(capsys, "grpo", "acter.optim.lr=1")
    assert "unknown key 'acter.optim.lr'; did you mean 'actor.optim.lr'?" in err
    assert "(from override 'acter.optim.lr=1')" in err


def test_cli_override_in_the_place_of_the_preset(capsys):
    # the CLI reads a first argument with '=' as an override of the default preset
    err = cli_error(capsys, "acter.optim.lr=1")
    assert "unknown key 'acter.optim.lr'; did you mean 'actor.optim.lr'?" in err


def test_cli_collects_every_problem(capsys):
    err = cli_error(capsys, "grpo", "acter.optim.lr=1", "actor=3", "rollout.n=[4,8]")
    assert "3 problems in the configuration" in err


def test_cli_prints_a_good_config(capsys):
    assert main(["config", "dapo", "rollout.n=8"]) == 0
    assert "  n: 8\n" in capsys.readouterr().out


# --- override values ----------------------------------------------------------------------------


def test_whole_section_set_to_a_scalar():
    msg = error_of("actor=3")
    assert "actor is a section, not a single value (got 3): set the keys inside it" in msg
    assert "e.g. actor.model_path=..." in msg


def test_section_set_to_nothing():
    assert "actor.optim is a section, not a single value" in error_of("actor.optim=")
    assert "actor.optim is a section" in error_of("actor.optim=null")


def test_section_given_a_mapping_merges_into_the_preset():
    cfg = load_config("grpo", ["actor.optim={weight_decay: 0.1, eps: 1e-6}"])
    assert cfg.actor.optim.weight_decay == 0.1 and cfg.actor.optim.eps == 1e-6
    assert cfg.actor.optim.lr == 1e-5  # from the base preset, not reset to the schema default


def test_list_where_a_number_belongs_and_a_mapping_where_a_list_belongs():
    assert "rollout.n: got [4, 8], expected an integer" in error_of("rollout.n=[4,8]")
    assert "data.train_files: got {'a': 1}, expected a list of strings" in error_of("data.train_files={a: 1}")


def test_single_value_where_a_list_belongs_is_a_list_of_one():
    assert load("trainer.loggers=jsonl").trainer.loggers == ["jsonl"]
    assert load("data.train_files=3").data.train_files == ["3"]


def test_empty_value_for_a_required_field_names_an_example():
    msg = error_of("actor.optim.lr=")
    assert "actor.optim.lr needs a value (a number), e.g. actor.optim.lr=1e-06" in msg
    msg = error_of("trainer.experiment_name=")
    assert "trainer.experiment_name needs a value (a string)" in msg
    assert "for empty text write trainer.experiment_name=''" in msg
    assert "data.truncation needs a value (one of 'error', 'filter', 'left', 'right')" in error_of(
        "data.truncation="
    )


def test_empty_value_clears_optional_fields_and_empties_lists():
    cfg = load("actor.model_path=/m", "actor.model_path=", "trainer.total_training_steps=", "data.val_files=")
    assert cfg.actor.model_path is None  # not "", which would count as a path
    assert cfg.trainer.total_training_steps is None
    assert cfg.data.val_files == []
    assert load("reward.custom_reward_kwargs=").reward.custom_reward_kwargs == {}
    assert load("reward.format.pattern=''").reward.format.pattern == ""


def test_value_with_an_equals_sign_and_quotes():
    cfg = load(
        "reward.format.pattern=a=b",
        "trainer.project_name='x=1'",
        'trainer.experiment_name="hi there"',
        "actor.optim.lr='1e-6'",
    )
    assert cfg.reward.format.pattern == "a=b"
    assert cfg.trainer.project_name == "x=1"
    assert cfg.trainer.experiment_name == "hi there"
    assert cfg.actor.optim.lr == 1e-6
    assert "actor.optim.lr: got '=1e-6', expected a number" in error_of("actor.optim.lr==1e-6")


def test_negative_numbers():
    assert load("rollout.top_k=-1").rollout.top_k == -1
    assert load("reward.format.mismatch_reward=-0.5").reward.format.mismatch_reward == -0.5
    assert "actor.optim.lr=-1e-06 must be > 0" in error_of("actor.optim.lr=-1e-6")
    assert "trainer.nnodes=-2 must be >= 1" in error_of("trainer.nnodes=-2")


@pytest.mark.parametrize("text", ["inf", "nan", "-inf", ".inf", ".nan", "1e400"])
def test_non_finite_floats_are_refused(text):
    assert "actor.optim.lr: got" in error_of(f"actor.optim.lr={text}")
    assert "only finite numbers are allowed" in error_of(f"actor.optim.lr={text}")


def test_non_finite_float_in_an_optional_field_points_at_null():
    msg = error_of("actor.grad_clip=inf")
    assert "actor.grad_clip: got 'inf', but only finite numbers are allowed; use null to turn it off" in msg
    assert "actor.optim.betas[1]: got 'nan'" in error_of("actor.optim.betas=[0.9,nan]")


def test_non_finite_float_set_in_python_is_refused():
    cfg = load()
    cfg.actor.optim.lr = float("nan")  # nan passes every `<` check, so it needs its own rule
    with pytest.raises(ConfigError, match=r"actor.optim.lr=nan: only finite numbers are allowed"):
        validate_config(cfg)


@pytest.mark.parametrize(("text", "value"), [("True", True), ("1", True), ("off", False), ("FALSE", False)])
def test_bool_spellings(text, value):
    assert load(f"data.shuffle={text}").data.shuffle is value


def test_bool_that_is_not_one():
    assert "data.shuffle: got 2, expected true or false" in error_of("data.shuffle=2")


def test_derived_values_cannot_be_set():
    msg = error_of("derived.actor_grad_accum_steps=4")
    assert "derived.actor_grad_accum_steps: derived is computed from the other settings" in msg


def test_malformed_keys():
    assert "override 'actor.=1' must look like section.key=value" in error_of("actor.=1")
    assert "must look like section.key=value" in error_of("actor..optim.lr=1")
    msg = error_of("~actor.optim.lr")
    assert "actor.optim.lr: keys cannot be removed" in msg and "(from override '~actor.optim.lr')" in msg
    assert load("++actor.optim.lr=2e-6").actor.optim.lr == 2e-6  # Hydra's "add" prefix is harmless


def test_override_problem_is_not_blamed_on_the_preset_file():
    msg = error_of("trainer.n_gpus=2", preset="grpo")
    assert "(from override 'trainer.n_gpus=2')" in msg and "preset" not in msg


# --- names from verl and TRL --------------------------------------------------------------------
# verl's keys are read as Tandem's (tests/verl/ covers the translation in full); TRL's are named.


@pytest.mark.parametrize(
    ("override", "key", "value"),
    [
        ("actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor.ppo_mini_batch_size", 8),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor.micro_batch_size_per_rank", 2),
        ("actor_rollout_ref.actor.optim.lr=3e-6", "actor.optim.lr", 3e-6),
        ("actor_rollout_ref.rollout.name=hf", "rollout.engine", "hf"),
        ("actor_rollout_ref.rollout.val_kwargs.temperature=0.5", "rollout.val.temperature", 0.5),
        (
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
            "reference.log_prob_micro_batch_size_per_rank",
            2,
        ),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor.policy_loss", "gspo"),
        ("critic.model.path=/models/c", "critic.model_path", "/models/c"),
        ("trainer.n_gpus_per_node=2", "trainer.workers_per_node", 2),
        ("trainer.logger=[console,jsonl]", "trainer.loggers", ["console", "jsonl"]),
        ("reward_model.overlong_buffer.len=64", "reward.overlong.buffer_len", 64),
        ("algorithm.filter_groups.enable=true", "algorithm.dynamic_sampling.enable", True),
        ("custom_reward_function.name=score", "reward.custom_reward_function", "score"),
        ("global_profiler.steps=[2]", "trainer.profile.steps", [2]),
    ],
)
def test_verl_key_is_read_as_the_tandem_key(override, key, value):
    cfg = load(override)
    got = cfg
    for part in key.split("."):
        got = getattr(got, part)
    assert got == value


def test_verl_key_with_a_different_unit_is_divided_as_verl_divides_it():
    # verl's older global size, over its default 8 GPUs (1 node), divided as verl's workers divide it
    cfg = load("actor_rollout_ref.actor.ppo_micro_batch_size=64", "actor.use_dynamic_bsz=false")
    assert cfg.actor.micro_batch_size_per_rank == 8
    msg = error_of("actor_rollout_ref.actor.ppo_micro_batch_size=4")  # 4 over 8 GPUs: 0 per GPU
    assert (
        "verl counts it over all GPUs: 4 over 8 data-parallel GPUs is 0 per GPU; give the size on one GPU: "
        in msg
    )
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" in msg


def test_verl_key_tandem_has_no_meaning_for_is_an_error_without_a_tandem_guess():
    msg = error_of("critic.model.use_remove_paddin=true")
    assert "critic.model.use_remove_paddin: not a key of verl's config, and none Tandem reads" in msg
    assert "Did you mean 'critic.model.use_remove_padding'" in msg
    assert "critic.model_path" not in msg  # no nearest-string guess across verl's prefix


@pytest.mark.parametrize(
    ("key", "tandem"),
    [
        ("learning_rate", "'actor.optim.lr'"),
        ("num_generations", "'rollout.n'"),
        ("max_completion_length", "'data.max_response_length'"),
        ("beta", "'actor.kl_loss_coef' (with actor.use_kl_loss=true)"),
        ("per_device_train_batch_size", "'actor.micro_batch_size_per_rank'"),
        ("num_train_epochs", "'trainer.total_epochs'"),
    ],
)
def test_trl_argument_names_the_tandem_key(key, tandem):
    assert f"unknown key '{key}': that is TRL's name; in Tandem use {tandem}" in error_of(f"{key}=1")


def test_pasted_verl_yaml_section_is_read_as_verl(tmp_path):
    path = tmp_path / "verl.yaml"
    path.write_text("actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 4\n")
    cfg = load_config(str(path))
    assert cfg.actor.ppo_mini_batch_size == 4
    assert cfg.trainer.project_name == "verl_examples"  # the verl preset is the base


# --- presets and YAML files ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typo", "preset"), [("grop", "grpo"), ("GRPO", "grpo"), ("ppo2", "ppo"), ("dapo_", "dapo")]
)
def test_preset_typo_suggests_the_preset(typo, preset):
    with pytest.raises(
        ConfigError, match=f"'{typo}' is neither a preset nor a YAML file. Did you mean '{preset}'"
    ):
        load_config(typo)


def test_preset_name_written_as_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError, match="grpo.yaml' does not exist; for the bundled preset write just 'grpo'"
    ):
        load_config("grpo.yaml")


def test_yaml_that_is_not_a_mapping(tmp_path):
    for text, kind in [("- a\n- b\n", "list"), ("just text\n", "str"), ("3\n", "int")]:
        path = tmp_path / "run.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=f"run.yaml must hold a mapping of sections .* not a {kind}"):
            load_config(str(path))


def test_empty_yaml_is_the_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing yet\n")
    assert load_config(str(path)) == load_config()


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("actor:\n  optim:\n    lr: 1e-6\n  bad: [1, 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    msg = str(info.value)
    assert f"{path} is not valid YAML (line 5, column 1): expected ',' or ']'" in msg
    assert "(while parsing a flow sequence at line 4)" in msg


def test_yaml_tab_indentation_says_to_use_spaces(tmp_path):
    path = tmp_path / "tabs.yaml"
    path.write_text("actor:\n\tppo_epochs: 2\n")
    with pytest.raises(
        ConfigError, match=r"tabs.yaml is not valid YAML \(line 2, column 1\).*Indent with spaces"
    ):
        load_config(str(path))


def test_yaml_key_given_twice_is_an_error(tmp_path):
    # PyYAML would keep only the second `actor:` and drop ppo_mini_batch_size without a word.
    path = tmp_path / "twice.yaml"
    path.write_text("actor:\n  ppo_mini_batch_size: 2\ntrainer:\n  nnodes: 1\nactor:\n  ppo_epochs: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    msg = str(info.value)
    assert "twice.yaml is not valid YAML (line 5, column 1): key 'actor' appears twice" in msg
    assert "(first at line 1)" in msg


def test_problems_in_a_file_name_the_file(tmp_path):
    (tmp_path / "common.yaml").write_text("base: grpo\nrollout:\n  n: 8\n")
    path = tmp_path / "run.yaml"
    path.write_text("base: common.yaml\nactor:\n  ppo_mini_batch_sise: 4\n  optim: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    problems = info.value.problems
    assert len(problems) == 2
    assert any(
        "'actor.ppo_mini_batch_sise'; did you mean 'actor.ppo_mini_batch_size'?" in p for p in problems
    )
    assert any(p.startswith("actor.optim is a section") for p in problems)
    assert all(p.endswith(f"(in {path})") for p in problems)


def test_rule_broken_in_a_file_is_said_once(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("base: grpo\nactor:\n  ppo_epochs: 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    # Not repeated for critic.ppo_epochs, which inherits it; no file named: a rule may involve several.
    assert info.value.problems == ["actor.ppo_epochs=0 must be >= 1"]
    assert "critic.ppo_epochs=0 must be >= 1" in error_of("critic.ppo_epochs=0")


def test_base_naming_a_missing_preset_names_the_file_that_says_so(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("base: grop\n")
    with pytest.raises(
        ConfigError, match=r"run.yaml: base: 'grop' is neither a preset .* Did you mean 'grpo'"
    ):
        load_config(str(path))
    path.write_text("base: missing.yaml\n")
    with pytest.raises(ConfigError, match=r"run.yaml: base: config file .*missing.yaml' does not exist"):
        load_config(str(path))


def test_base_that_includes_itself(tmp_path):
    path = tmp_path / "self.yaml"
    path.write_text("base: self.yaml\n")
    with pytest.raises(ConfigError, match="include each other in a loop: .*self.yaml -> .*self.yaml"):
        load_config(str(path))


def test_base_must_be_one_name(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("base: [grpo, ppo]\n")
    with pytest.raises(ConfigError, match=r"run.yaml: 'base:' must name one preset or YAML path"):
        load_config(str(path))


def test_key_below_a_section_set_to_a_scalar_keeps_that_error():
    msg = error_of("actor=3", "actor.optim.lr=1e-6")
    assert "actor is a section, not a single value (got 3)" in msg


def test_load_config_with_an_override_in_the_place_of_the_preset():
    from tandem.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="looks like an override"):
        load_config("acter.optim.lr=1")
