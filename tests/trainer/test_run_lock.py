import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from tandem.trainer import run_lock
from tandem.trainer.run_lock import LOCK_NAME, RunLock, RunLockedError

# run_lock.py loaded by path: importing the tandem.trainer package would load torch (seconds)
HOLDER = textwrap.dedent(
    """
    import importlib.util, sys, time
    spec = importlib.util.spec_from_file_location("run_lock", sys.argv[2])
    run_lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_lock)
    with run_lock.RunLock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(120)
    """
)


def hold_in_another_process(run_dir) -> subprocess.Popen:
    """A process that holds the run folder until it is killed; returns once it holds it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir), run_lock.__file__],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held", proc.stderr.read()
    return proc


def test_a_second_holder_is_refused_with_the_folder_and_the_holder(tmp_path):
    holder = hold_in_another_process(tmp_path)
    try:
        with pytest.raises(RunLockedError) as refused:
            RunLock(tmp_path).acquire()
        message = str(refused.value)
        assert str(tmp_path) in message and f"pid {holder.pid} on host {socket.gethostname()}" in message
        assert "trainer.experiment_name" in message
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_killed_run_on_this_host_is_taken_over_with_a_warning(tmp_path, caplog):
    holder = hold_in_another_process(tmp_path)
    holder.send_signal(signal.SIGKILL)  # no clean-up: the lock file stays, the flock goes with the process
    holder.wait()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == holder.pid
    with caplog.at_level(logging.WARNING), RunLock(tmp_path):
        held = json.loads((tmp_path / LOCK_NAME).read_text())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
    assert f"taking over the lock of pid {holder.pid}" in caplog.text
    assert not (tmp_path / LOCK_NAME).exists()  # released: the file goes with it


def test_a_lock_file_from_another_host_is_not_taken_over(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": "node-7", "pid": 4242}))
    with pytest.raises(RunLockedError, match=r"another host: pid 4242 on host node-7.*delete .*\.lock"):
        RunLock(tmp_path).acquire()


def test_the_same_process_cannot_hold_a_folder_twice_and_can_take_it_again_after_release(tmp_path):
    with RunLock(tmp_path), pytest.raises(RunLockedError):
        RunLock(tmp_path).acquire()
    with RunLock(tmp_path):
        pass
