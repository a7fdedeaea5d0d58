"""Property: a config written with config_to_yaml() (or config_to_dict()) reads back into an equal config.

Random configs are built from every preset with awkward values in the fields that take free text
or numbers: YAML-looking strings, exponents, negative zero, nested reward kwargs.
"""

import random

import pytest
import yaml

from tandem.config import (
    TandemConfig,
    config_from_dict,
    config_to_dict,
    config_to_yaml,
    list_presets,
    load_config,
    validate_config,
)

TRICKY_TEXT = [
    "007", "yes", "no", "on", "true", "False", "1e-6", "0x10", ".inf", "-", "a: b", "- item", "#not a comment",
    "'single'", '"double"', "multi\nline", " leading", "trailing ", "", "ünïcödé ✓", "[1, 2]", "{a: 1}",
    "a=b", "%percent", "@at", "`tick`", "*star", "&anchor", "!tag", "? q", "|", ">", "...", "---", "C:\\path",
]  # fmt: skip
# An Optional[str] field reads the words null / ~ / None as "no value", so they cannot round-trip there.
NULL_WORDS = {"null", "Null", "NULL", "~", "None"}


def _text(rng: random.Random) -> str:
    return rng.choice(TRICKY_TEXT) if rng.random() < 0.8 else "".join(rng.choices("ab:-#' \"\n{}[]", k=6))


def _number(rng: random.Random) -> float:
    return rng.choice([0.0, -0.0, 1e-300, 1e300, 0.1 + 0.2, -2.5, 1 / 3, rng.uniform(-1e6, 1e6)])


def _free_value(rng: random.Random, depth: int = 0):
    kinds = ["int", "float", "text", "bool", "none"] + (["list", "dict"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(-(2**40), 2**40)
    if kind == "float":
        return _number(rng)
    if kind == "text":
        return _text(rng)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "list":
        return [_free_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {_text(rng): _free_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def random_config(seed: int) -> TandemConfig:
    rng = random.Random(seed)
    cfg = load_config(rng.choice(list_presets()))
    t, d, a, r, rew = cfg.trainer, cfg.data, cfg.actor, cfg.rollout, cfg.reward
    t.project_name, t.experiment_name, t.output_dir = _text(rng), _text(rng), _text(rng)
    d.prompt_key, rew.custom_reward_function, rew.format.pattern = _text(rng), _text(rng), _text(rng)
    optional_text = [x for x in TRICKY_TEXT if x not in NULL_WORDS] + [None]
    a.model_path = rng.choice(optional_text)
    cfg.critic.model_path = rng.choice(optional_text)
    d.train_files = [_text(rng) for _ in range(rng.randint(0, 3))]
    d.val_files = [_text(rng) for _ in range(rng.randint(0, 2))]
    t.loggers = rng.sample(["console", "jsonl", "tensorboard", "wandb", "mlflow"], rng.randint(0, 3))
    t.seed, d.seed = rng.randint(-(2**31), 2**31), rng.randint(0, 2**63)
    t.total_training_steps = rng.choice([None, 1, 10**9])
    t.max_checkpoints_to_keep = rng.choice([None, 1, 3])
    r.top_k = rng.choice([-1, 1, 50])
    a.optim.lr = 10 ** rng.uniform(-9, -2)
    a.optim.betas = (rng.uniform(0, 0.999), rng.uniform(0, 0.999))
    a.entropy_coeff = _number(rng)
    rew.format.match_reward, rew.format.mismatch_reward = _number(rng), _number(rng)
    rew.timeout_s = rng.uniform(1e-3, 1e4)
    rew.custom_reward_kwargs = {_text(rng): _free_value(rng) for _ in range(rng.randint(0, 4))}
    d.shuffle, a.activation_checkpointing = rng.random() < 0.5, rng.random() < 0.5
    d.truncation = rng.choice(["error", "filter", "left", "right"])
    d.chat_template = rng.choice(["auto", "plain", "none"])
    a.fsdp.param_dtype = rng.choice(["float32", "bfloat16", "float16"])
    a.optim.lr_scheduler = rng.choice(["constant", "cosine", "linear"])
    return validate_config(cfg)


@pytest.mark.parametrize("seed", range(60))
def test_to_yaml_reads_back_equal(seed, tmp_path):
    cfg = random_config(seed)
    path = tmp_path / "dump.yaml"
    path.write_text(config_to_yaml(cfg))
    again = load_config(str(path))
    assert again == cfg
    assert again.derived == cfg.derived
    assert config_to_yaml(again) == config_to_yaml(cfg)  # stable: a second trip changes nothing


@pytest.mark.parametrize("seed", range(60))
def test_to_dict_reads_back_equal(seed):
    cfg = random_config(seed)
    plain = config_to_dict(cfg)
    assert config_from_dict(plain) == cfg
    assert config_from_dict(yaml.safe_load(yaml.safe_dump(plain))) == cfg
    assert config_to_dict(config_from_dict(plain)) == plain


@pytest.mark.parametrize("name", list_presets())
def test_preset_to_yaml_reads_back_equal(name, tmp_path):
    cfg = load_config(name)
    path = tmp_path / f"{name}.yaml"
    path.write_text(config_to_yaml(cfg))
    assert load_config(str(path)) == cfg
    assert load_config(str(path)).derived == cfg.derived
