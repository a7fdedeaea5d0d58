"""The weight bus (trainer rank 0 -> rollout workers over a gloo group of its own): exact copies in the
sender's order, bucket and byte counts, consecutive and aborted syncs, and errors instead of hangs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from engine.ranks import forkserver, start_ranks  # tests/ is on sys.path (pytest's rootdir)
from tandem.roles.weight_bus import WeightBus, WeightBusError, free_address

from . import weight_bus_worker as w

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """1 source + 2 receivers, 4 syncs (see weight_bus_worker.three_ranks)."""
    out = tmp_path_factory.mktemp("weight_bus")
    start_ranks(w.three_ranks, (3, free_address(), str(out)), 3)
    return [torch.load(out / f"rank{r}.pt") for r in range(3)]


def assert_exact(received, sent):
    assert [name for name, _ in received] == [name for name, _ in sent]
    for (name, got), (_, want) in zip(received, sent):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), name  # bitwise for these values: no rounding anywhere


def test_every_receiver_gets_exact_copies_in_order(three):
    for receiver in three[1:]:
        assert_exact(receiver["syncs"][0], w.mixed(0))
        assert_exact(receiver["syncs"][1], w.kib_tensors())
        assert_exact(receiver["syncs"][2], w.mixed(1))  # the bus is still in step after the aborted sync


def test_stats_count_buckets_and_tensor_bytes(three):
    mixed, kib, mixed_again = three[0]["stats"]
    # [a b c] [big: larger than a bucket, alone] [d e f t empty mask] [g]
    assert mixed["weight_sync_buckets"] == 4
    assert mixed["weight_sync_bytes"] == sum(t.numel() * t.element_size() for _, t in w.mixed(0)) == 10731
    assert kib["weight_sync_buckets"] == 3  # 10 x 1 KiB in 4 KiB buckets: 4 + 4 + 2
    assert kib["weight_sync_bytes"] == 10 * 1024
    assert mixed_again["weight_sync_buckets"] == 4
    assert all(s["weight_sync_s"] > 0 for s in three[0]["stats"])


def test_a_failing_weight_iterator_aborts_the_sync_on_every_rank(three):
    assert three[0]["abort"] == "gather failed on trainer rank 0"
    for receiver in three[1:]:
        assert receiver["before_abort"] == [f"layer.{i}" for i in range(4)]  # the first full bucket
        assert "the source aborted sync 2: RuntimeError: gather failed on trainer rank 0" in receiver["abort"]


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="bucket_bytes=0 must be > 0"):
        WeightBus("127.0.0.1:1", 0, 2, bucket_bytes=0)
    with pytest.raises(ValueError, match="rank=2 is outside 0..1"):
        WeightBus("127.0.0.1:1", 2, 2)
    with pytest.raises(ValueError, match="needs the source and at least one receiver"):
        WeightBus("127.0.0.1:1", 0, 1)
    with pytest.raises(ValueError, match="is not 'host:port'"):
        WeightBus("localhost", 0, 2)


def test_free_address_without_ray_is_local(monkeypatch):
    # another test in this process may have initialised Ray (then the host is the node's IP):
    # hide the module so this checks the no-Ray branch whatever ran before
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    host, port = free_address().rsplit(":", 1)
    assert host == "127.0.0.1" and 0 < int(port) < 65536


def test_a_receiver_that_never_joins_fails_the_source_in_time():
    address = free_address()
    start = time.monotonic()
    with pytest.raises(WeightBusError) as err:
        WeightBus(address, 0, 3, timeout_s=2)
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert f"weight bus {address}, rank 0 (source)" in message
    assert "waited 2 s for receiver ranks [1, 2] to join" in message


def test_a_source_that_never_comes_fails_the_receiver_in_time():
    address = free_address()
    start = time.monotonic()
    with pytest.raises(WeightBusError, match=f"weight bus {address}, rank 1 \\(receiver\\)"):
        WeightBus(address, 1, 2, timeout_s=2)
    assert time.monotonic() - start < 4


def test_mismatched_world_sizes_fail_both_sides():
    address, errors = free_address(), {}

    def source():
        try:
            WeightBus(address, 0, 2, timeout_s=20)
        except WeightBusError as e:
            errors["source"] = str(e)

    thread = threading.Thread(target=source)
    thread.start()
    start = time.monotonic()
    with pytest.raises(WeightBusError, match="world_size=3, but the source has world_size=2"):
        WeightBus(address, 1, 3, timeout_s=20)
    thread.join()
    assert time.monotonic() - start < 10  # both fail at once, not after the timeout
    assert "receivers {1: 3} (rank: world_size) disagree with the source's world_size=2" in errors["source"]


def _receiver_process(target, *args):
    process = forkserver().Process(target=target, args=args)
    process.start()
    return process


def test_a_receiver_that_does_not_receive_fails_the_send_in_time():
    address, started = free_address(), forkserver().Event()
    receiver = _receiver_process(w.idle_receiver, address, 30.0, started)
    try:
        assert started.wait(60)  # torch imported: it joins at once
        bus = WeightBus(address, 0, 2, timeout_s=3)
        start = time.monotonic()
        with pytest.raises(WeightBusError) as err:
            bus.send(w.kib_tensors())
        assert time.monotonic() - start < 10
        assert f"weight bus {address}, rank 0 (source): sync 0: waited up to 3 s for ranks 1..1" in str(
            err.value
        )
        with pytest.raises(WeightBusError, match="out of step"):  # no second try on a bus in an unknown state
            bus.send(w.kib_tensors())
        bus.close()
    finally:
        receiver.kill()
        receiver.join()


def test_a_receiver_that_dies_fails_the_send():
    address = free_address()
    receiver = _receiver_process(w.dying_receiver, address)
    try:
        with WeightBus(address, 0, 2, timeout_s=20) as bus:
            receiver.join(timeout=20)
            start = time.monotonic()
            with pytest.raises(
                WeightBusError, match=f"weight bus {address}, rank 0 .*a peer died.*Connection closed"
            ):
                bus.send(w.kib_tensors())
            assert time.monotonic() - start < 15  # a closed connection, not the 20 s timeout
    finally:
        receiver.kill()
        receiver.join()


def test_send_and_receive_belong_to_their_ranks():
    address = free_address()
    thread = threading.Thread(target=lambda: buses.append(WeightBus(address, 1, 2, timeout_s=20)))
    buses: list[WeightBus] = []
    thread.start()
    source = WeightBus(address, 0, 2, timeout_s=20)
    thread.join()
    with pytest.raises(ValueError, match="only rank 0"):
        buses[0].send([])
    with pytest.raises(ValueError, match="rank 0 is the source"):
        source.receive()
    buses[0].close()
    source.close()
    with pytest.raises(WeightBusError, match="closed"):
        source.send([])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_ray_nodes():
    """One actor per Ray node (two nodes on this machine): the source's node IP in the address, exact copies."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    temp_dir = tempfile.mkdtemp(prefix="tdm-")  # short: Ray's socket paths must stay under ~107 bytes
    try:
        proc = subprocess.run(
            [sys.executable, str(HERE / "weight_bus_worker.py"), temp_dir],
            env=env,
            capture_output=True,
            text=True,
            timeout=110,
        )
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["nodes"][0] != report["nodes"][1]
    assert report["equal"] and report["received"] == len(w.mixed(0))
    assert report["stats"]["weight_sync_buckets"] == 4
