"""Typed configuration: dataclass schema, YAML presets, dotted overrides, validation, derived sizes.

cfg = load_config("grpo", ["actor.optim.lr=1e-6", "data.train_files=[train.parquet]"])
cfg.derived.actor_grad_accum_steps

A config is plain data: build one with `load_config` / `config_from_dict`, check one built in Python with
`validate_config`, write one with `config_to_dict` / `config_to_yaml`.
"""

from tandem.config.errors import ConfigError
from tandem.config.loader import config_from_dict, config_to_dict, config_to_yaml, list_presets, load_config
from tandem.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
    DataConfig,
    Derived,
    DynamicSamplingConfig,
    FormatConfig,
    FSDPConfig,
    KLControlConfig,
    MegatronConfig,
    OptimConfig,
    OverlongConfig,
    ReferenceConfig,
    RewardConfig,
    RewardModelConfig,
    RolloutConfig,
    TandemConfig,
    TrainerConfig,
    ValRolloutConfig,
)
from tandem.config.validate import validate_config

__all__ = [
    "ActorConfig",
    "AlgorithmConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "Derived",
    "DynamicSamplingConfig",
    "FSDPConfig",
    "FormatConfig",
    "KLControlConfig",
    "MegatronConfig",
    "OptimConfig",
    "OverlongConfig",
    "ReferenceConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "TandemConfig",
    "TrainerConfig",
    "ValRolloutConfig",
    "config_from_dict",
    "config_to_dict",
    "config_to_yaml",
    "list_presets",
    "load_config",
    "validate_config",
]
