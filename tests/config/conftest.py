import pytest

from tandem.config.checks.names import registries


@pytest.fixture
def real_registries():
    """The registries `import tandem.algos` fills; once it is imported, config validates every name against
    them (before, against their torch-free list, tandem/algo_options.py: tests/algos/test_algo_options.py)."""
    import tandem.algos  # noqa: F401 - importing registers the built-in names

    return registries()
