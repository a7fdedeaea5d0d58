import os
import tempfile

import pytest

# param_dtype=auto measures bf16 against fp32 on a CPU with native bf16 (engine/auto_dtype.py) and could pick
# bf16 on such a CI host; the parity tests compare in fp32 at 1e-5. Set before anything starts: spawned
# ranks, `tandem` subprocesses and the Ray workers started by these tests inherit it.
os.environ["TANDEM_AUTO_CPU_DTYPE"] = "float32"


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


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """A 1-rank gloo process group in this process (unless one is up already), and a tiny model's folder."""
    import torch.distributed as dist

    from tandem.models.tiny import save_tiny

    root = tmp_path_factory.mktemp("one_rank")
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"file://{root / 'store'}", rank=0, world_size=1)
    yield save_tiny(root / "model")
    if created:
        dist.destroy_process_group()
