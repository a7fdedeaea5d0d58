"""Typed configuration: dataclass schema, YAML presets, dotted overrides, validation, derived sizes.

cfg = load_config("grpo", ["actor.optim.lr=1e-6", "data.train_files=[train.parquet]"])
cfg.derived.actor_grad_accum_steps
"""

from tandem.config.derived import Derived
from tandem.config.errors import ConfigError
from tandem.config.loader import list_presets, load_config
from tandem.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
    DataConfig,
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
    "list_presets",
    "load_config",
]
