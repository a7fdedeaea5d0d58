"""trainer.ray_address unset starts a Ray of the run's own, even beside another job's Ray on the machine."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

OTHER_JOB = textwrap.dedent(
    """
    import sys, time, ray
    ray.init(num_cpus=1, include_dashboard=False)
    print(ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.read()  # alive until the test closes stdin
    """
)

RUN = textwrap.dedent(
    """
    import ray
    from tandem.controller import init_ray
    init_ray(num_cpus=1)
    print(ray.get_runtime_context().gcs_address, ray.cluster_resources().get("CPU"), flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_unset_ray_address_starts_its_own_ray_beside_another_jobs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER_JOB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        other_address = other.stdout.readline().strip()
        assert other_address, "the other job's Ray did not start"
        done = subprocess.run(
            [sys.executable, "-c", RUN], capture_output=True, text=True, env=env, timeout=150
        )
        assert done.returncode == 0, done.stderr
        address, cpus = done.stdout.split()
        assert address != other_address and float(cpus) == 1.0
        assert "Connecting to latest cluster" not in done.stderr
    finally:
        other.stdin.close()
        other.wait(timeout=60)
