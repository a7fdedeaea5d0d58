import pytest

from tandem.config.checks.names import registries


@pytest.fixture
def real_registries():
    """The registries `import tandem.algos` fills; config validates every name against them."""
    return registries()
