import pytest

from tandem.config import validate


@pytest.fixture
def real_registries():
    """The registries `import tandem.algos` fills; config validates every name against them."""
    return validate._registries()
