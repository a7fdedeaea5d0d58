import os
import tempfile

import pytest


@pytest.fixture(scope="session")
def ray_local():
    """A real single-node Ray with a temp dir of its own (DESIGN.md: 4-11 s to start).

    4 logical CPUs (more than the machine's cores): room for two resource pools of 2 one-CPU ranks.
    """
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    tmp = tempfile.mkdtemp(prefix="tandem-ray-")
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
    yield ray
    ray.shutdown()
