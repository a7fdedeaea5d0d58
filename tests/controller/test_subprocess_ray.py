"""Controllers that need a Ray of their own, run as scripts in a subprocess.

The test session's single-node Ray (the `ray_local` fixture) cannot be reshaped into several nodes,
nor interrupted, so each test runs a driver script beside this file (cluster_driver.py,
interrupt_driver.py) with its own Ray in a short temp dir, and checks what the script prints.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .toy_workers import pids_still_there

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

HERE = Path(__file__).parent


@pytest.fixture
def ray_env():
    """Environment and a short temp dir (Ray's socket paths must stay under ~107 bytes) for a driver."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)  # the driver starts its own Ray, it must not join another
    temp_dir = tempfile.mkdtemp(prefix="tdm-")
    yield env, temp_dir
    shutil.rmtree(temp_dir, ignore_errors=True)


def test_cluster_of_two_ray_nodes_puts_one_rank_on_each(ray_env):
    env, temp_dir = ray_env
    proc = subprocess.run(
        [sys.executable, str(HERE / "cluster_driver.py"), temp_dir],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    # two Ray nodes, one rank on each (each node offers 1 CPU, each pool node needs 1)
    assert report["head_node_id"] != report["second_node_id"]
    assert {r["node_id"] for r in ranks} == {report["head_node_id"], report["second_node_id"]}
    assert [r["node_rank"] for r in ranks] == [0, 1]
    assert [r["local_rank"] for r in ranks] == [0, 0]
    assert report["all_reduce"] == [3.0, 3.0]  # (0 + 1) + (1 + 1) across the two nodes


def test_interrupt_kills_the_workers_and_the_driver_exits(ray_env):
    env, temp_dir = ray_env
    out_path, err_path = Path(temp_dir) / "stdout", Path(temp_dir) / "stderr"
    with out_path.open("w") as out, err_path.open("w") as err:
        # a session of its own: a Ctrl-C in the terminal running pytest does not reach it
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "interrupt_driver.py"), temp_dir],
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    try:
        end = time.monotonic() + 90
        while not out_path.read_text().endswith("\n"):
            assert proc.poll() is None, f"driver exited early:\n{err_path.read_text()[-4000:]}"
            assert time.monotonic() < end, f"no worker pids after 90 s:\n{err_path.read_text()[-4000:]}"
            time.sleep(0.1)
        pids = json.loads(out_path.read_text().splitlines()[0])["pids"]
        assert len(pids) == 2 and pids_still_there(pids, 0) == pids
        time.sleep(1.0)  # well inside the 60 s worker call

        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        exit_s = time.monotonic() - start

        stderr = err_path.read_text()
        lines = out_path.read_text().splitlines()
        assert len(lines) == 2, f"stdout: {lines}\nstderr:\n{stderr[-4000:]}"
        after = json.loads(lines[1])
        # seen by the driver while its Ray was still up: the SIGINT handler did this, not ray.shutdown()
        assert after["interrupted"] and after["workers_alive"] == []
        assert after["pool_removed"] and after["group"].endswith("shut down)")
        # then the KeyboardInterrupt went on and ended the driver (Ray's exit hook makes the status 1
        # rather than death by SIGINT when Ray is still up at exit)
        assert proc.returncode in (1, -signal.SIGINT), stderr[-4000:]
        assert stderr.rstrip().endswith("KeyboardInterrupt"), stderr[-4000:]
        assert exit_s < 30, f"the driver took {exit_s:.1f} s to exit after SIGINT"
        assert pids_still_there(pids, 20.0) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
