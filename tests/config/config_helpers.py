import pytest

from tandem.config import ConfigError, TandemConfig, load_config


def load(*overrides: str, preset: str | None = None) -> TandemConfig:
    return load_config(preset, list(overrides))


def error_of(*overrides: str, preset: str | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(preset, list(overrides))
    return str(info.value)
