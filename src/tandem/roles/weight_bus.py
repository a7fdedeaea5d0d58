"""The weight channel from the trainer to separate rollout workers (issue 17, the separate layout).

A `WeightBus` is a torch.distributed process group of its own, independent of every process's
default group: rank 0 (trainer rank 0, the source) hosts a `TCPStore` at `address`, and all ranks
build `ProcessGroupGloo` (CPU) or `ProcessGroupNCCL` (CUDA) directly on it. Ranks 1..world_size-1
are the rollout workers; the other trainer ranks are not on the bus (they iterate
`engine.state_dict_iter()` with rank 0 and drop what they get).

One sync is one `send()` on the source and one `receive()` on every receiver, in the same order
(the n-th send pairs with the n-th receive). The stream is a sequence of buckets, each three
broadcasts from rank 0:

    control  int64[4]   (kind, sync index, header bytes, payload bytes)
    header   uint8[...] JSON: [[name, dtype, shape, byte offset], ...] (or the abort message)
    payload  uint8[...] the bucket's tensors' bytes, each at an offset aligned to 16 bytes

and ends with an END control (or ABORT, when the sender's weight iterator raised: the receivers
raise with its message and the bus stays usable). The payload is raw bytes, so one bucket may mix
dtypes (a bf16 model with fp32 norms does not split into one bucket per dtype run).

Every wait is bounded by `timeout_s` (the store's rendezvous, each broadcast) and raises a
`WeightBusError` naming the bus address, the rank and what it waited for. A broadcast blocks until
every receiver takes part, so a send() whose receivers are not reading fails after `timeout_s`
rather than running ahead. After a failed broadcast or a receive() abandoned before its end marker
the bus is out of step: close it and build a new one.

The CUDA (NCCL) path is written but untested here (no GPU, and one GPU cannot host two NCCL ranks).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta

import torch
from torch import Tensor
from torch.distributed import PrefixStore, TCPStore

_BUCKET, _END, _ABORT = 1, 2, 3
_ALIGN = 16  # byte offsets of tensors in a bucket: a multiple of every element size


class WeightBusError(RuntimeError):
    """A peer of the weight bus died, never joined, disagreed on the bus's shape, or fell out of step."""


def free_address() -> str:
    """`host:port` with a port free now on this machine (another process may take it before the bus
    binds it: then WeightBus raises "address in use"). host: this node's IP as Ray sees it when Ray
    is initialised (receivers on other nodes must reach it), else 127.0.0.1."""
    host = "127.0.0.1"
    ray = sys.modules.get(
        "ray"
    )  # Ray is not imported just to ask: if it is not imported it is not initialised
    if ray is not None and ray.is_initialized():
        host = ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"{host}:{port}"


def send_from(bus: WeightBus | None, weights: Iterable[tuple[str, Tensor]]) -> dict[str, float]:
    """One sync on the trainer's side: its rank 0 (`bus`, the source) sends `weights`; its other ranks (`bus`
    None, not on the bus) iterate theirs and drop them, as the engine's gathers need every rank. Returns the
    sync's metrics on the source, {} elsewhere."""
    if bus is None:
        for _ in weights:
            pass
        return {}
    stats = bus.send(weights)
    return {
        "timing_s/weight_sync": stats["weight_sync_s"],
        "weight_sync/bytes": stats["weight_sync_bytes"],
        "weight_sync/buckets": stats["weight_sync_buckets"],
    }


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise WeightBusError(f"weight bus: unknown dtype {name!r} in a bucket header")
    return dtype


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class WeightBus:
    """rank 0 = the source (trainer rank 0); ranks 1..world_size-1 = rollout workers.

    Construct it on every rank with the same `address` (from `free_address()` on the source's node)
    and `world_size`; the constructor returns once all ranks have joined, or raises within
    `timeout_s` naming the ranks that did not."""

    def __init__(
        self,
        address: str,
        rank: int,
        world_size: int,
        *,
        device: str = "cpu",
        bucket_bytes: int = 256 << 20,
        timeout_s: float = 600.0,
    ) -> None:
        if world_size < 2:
            raise ValueError(
                f"WeightBus: world_size={world_size}; it needs the source and at least one receiver"
            )
        if not 0 <= rank < world_size:
            raise ValueError(
                f"WeightBus: rank={rank} is outside 0..{world_size - 1} (world_size={world_size})"
            )
        if bucket_bytes <= 0:
            raise ValueError(f"WeightBus: bucket_bytes={bucket_bytes} must be > 0 (e.g. 256 << 20)")
        if timeout_s <= 0:
            raise ValueError(f"WeightBus: timeout_s={timeout_s} must be > 0")
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"WeightBus: address={address!r} is not 'host:port' (use free_address())")
        self.address, self.rank, self.world_size = address, rank, world_size
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.bucket_bytes, self.timeout_s = bucket_bytes, timeout_s
        self._syncs = 0  # completed syncs: the index the next send/receive carries
        self._broken: str | None = None  # why the bus is out of step, once it is
        self._pg = None
        timeout = timedelta(seconds=timeout_s)
        if rank > 0:  # TCPStore's own connect retries overrun its timeout (2-2.5x here): wait ourselves
            self._wait_for_store(host, int(port), time.monotonic() + timeout_s)
        try:
            self._store = TCPStore(
                host, int(port), None, rank == 0, timeout, wait_for_workers=False, use_libuv=True
            )
        except Exception as e:
            what = "open the store (is the port free?)" if rank == 0 else "connect to the source's store"
            raise self._error(f"could not {what}", e) from e
        self._join()
        try:
            self._pg = self._process_group(PrefixStore("weight_bus", self._store), timeout)
        except Exception as e:
            raise self._error("failed building the process group (a peer died while connecting?)", e) from e

    # ----------------------------------------------------------------------------------- set-up

    def _error(self, what: str, cause: BaseException | None = None) -> WeightBusError:
        role = "source" if self.rank == 0 else "receiver"
        tail = f": {cause}" if cause is not None else ""
        return WeightBusError(f"weight bus {self.address}, rank {self.rank} ({role}): {what}{tail}")

    def _wait_for_store(self, host: str, port: int, deadline: float) -> None:
        while True:
            try:
                with socket.create_connection(
                    (host, port), timeout=max(min(deadline - time.monotonic(), 1.0), 0.05)
                ):
                    return
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise self._error(
                        f"waited {self.timeout_s:g} s for the source (rank 0) to open the bus's store", e
                    ) from e
                time.sleep(0.05)

    def _join(self) -> None:
        """A rendezvous over the store that names who is missing or disagrees, before any collective."""
        store, deadline = self._store, time.monotonic() + self.timeout_s
        if self.rank == 0:
            store.set("world_size", str(self.world_size))
            missing = list(range(1, self.world_size))
            while missing and time.monotonic() < deadline:
                missing = [r for r in missing if not store.check([f"join/{r}"])]
                if missing:
                    time.sleep(0.02)
            if missing:
                verdict = (
                    f"waited {self.timeout_s:g} s for receiver ranks {missing} to join "
                    f"(world_size={self.world_size}); start a WeightBus with this address on each of them"
                )
            else:
                sizes = {r: int(store.get(f"join/{r}")) for r in range(1, self.world_size)}
                wrong = {r: n for r, n in sizes.items() if n != self.world_size}
                verdict = (
                    f"receivers {wrong} (rank: world_size) disagree with the source's world_size={self.world_size}"
                    if wrong
                    else "ok"
                )
            store.set("ready", verdict)
            if verdict != "ok":
                raise self._error(verdict)
            return
        try:
            if store.add(f"joins/{self.rank}", 1) > 1:
                raise self._error("another receiver already joined with this rank")
            store.set(
                f"join/{self.rank}", str(self.world_size)
            )  # the source checks it too and tells the others
            source_size = int(store.get("world_size"))
            if source_size != self.world_size:
                raise self._error(
                    f"world_size={self.world_size}, but the source has world_size={source_size}"
                )
            store.wait(["ready"], timedelta(seconds=max(deadline - time.monotonic(), 0.1)))
            verdict = store.get("ready").decode()
        except WeightBusError:
            raise
        except Exception as e:
            raise self._error(
                f"waited up to {self.timeout_s:g} s for the source (rank 0) to confirm the join", e
            ) from e
        if verdict != "ok":
            raise self._error(f"the source refused the bus: {verdict}")

    def _process_group(self, store: PrefixStore, timeout: timedelta):
        if self.device.type == "cpu":
            return torch.distributed.ProcessGroupGloo(store, self.rank, self.world_size, timeout)
        if self.device.type == "cuda":  # untested here: written after torch's own _new_process_group_helper
            torch.cuda.set_device(self.device)
            options = torch.distributed.ProcessGroupNCCL.Options()
            options._timeout = timeout
            return torch.distributed.ProcessGroupNCCL(store, self.rank, self.world_size, options)
        raise ValueError(f"WeightBus: device={self.device} is not supported (cpu: gloo, cuda: nccl)")

    # ---------------------------------------------------------------------------- the wire

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise self._error(f"the bus is out of step ({self._broken}); close it and build a new one")
        if self._pg is None:
            raise self._error("the bus is closed")

    def _broadcast(self, tensor: Tensor, what: str) -> None:
        try:
            self._pg.broadcast([tensor], _broadcast_options()).wait()
        except Exception as e:
            self._broken = f"sync {self._syncs}: {what} failed"
            waited = (
                "ranks 1.." + str(self.world_size - 1) + " to receive"
                if self.rank == 0
                else "the source to send"
            )
            raise self._error(
                f"sync {self._syncs}: waited up to {self.timeout_s:g} s for {waited} the {what} "
                "(a peer died, or is not calling receive()/send() for this sync)",
                e,
            ) from e

    def _send_frame(self, kind: int, header: bytes, payload: Tensor | None, what: str) -> None:
        payload_bytes = 0 if payload is None else payload.numel()
        control = torch.tensor([kind, self._syncs, len(header), payload_bytes], dtype=torch.int64)
        self._broadcast(control.to(self.device), f"{what} control")
        if header:
            raw = torch.frombuffer(bytearray(header), dtype=torch.uint8)
            self._broadcast(raw.to(self.device), f"{what} header")
        if payload_bytes:
            self._broadcast(payload, f"{what} payload")

    # ----------------------------------------------------------------------------- source

    def send(self, weights: Iterable[tuple[str, Tensor]]) -> dict[str, float]:
        """Rank 0 only: stream `weights` to every receiver, in buckets of at most `bucket_bytes` (a larger
        tensor goes alone), in the order given; holds at most one bucket and one tensor. If `weights`
        raises, the receivers are told (their receive() raises with the message) and it is re-raised."""
        if self.rank != 0:
            raise ValueError(f"WeightBus.send: only rank 0 (the source) sends; this is rank {self.rank}")
        self._check_usable()
        start = time.perf_counter()
        buffer = torch.empty(
            self.bucket_bytes, dtype=torch.uint8, device=self.device
        )  # pages touched as filled
        entries: list[list] = []
        used = sent_bytes = buckets = 0

        def flush(payload: Tensor, header: list[list]) -> None:
            nonlocal buckets
            self._send_frame(_BUCKET, json.dumps(header).encode(), payload, f"bucket {buckets}")
            buckets += 1

        try:
            for name, tensor in weights:
                tensor = tensor.detach()
                nbytes = tensor.numel() * tensor.element_size()
                entry = [name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)]
                if nbytes > self.bucket_bytes:  # alone, from its own bytes: no copy into the buffer
                    if entries:
                        flush(buffer[:used], entries)
                        entries, used = [], 0
                    flat = tensor.to(self.device).contiguous().reshape(-1).view(torch.uint8)
                    flush(flat, [[*entry, 0]])
                    sent_bytes += nbytes
                    continue
                offset = _aligned(used)
                if offset + nbytes > self.bucket_bytes:
                    flush(buffer[:used], entries)
                    entries, offset = [], 0
                if nbytes:
                    buffer[offset : offset + nbytes].view(tensor.dtype).copy_(tensor.reshape(-1))
                entries.append([*entry, offset])
                used = offset + nbytes
                sent_bytes += nbytes
            if entries:
                flush(buffer[:used], entries)
        except WeightBusError:
            raise
        except Exception as e:  # the weights iterator (or a tensor) failed: tell the receivers, keep in step
            self._send_frame(_ABORT, f"{type(e).__name__}: {e}".encode(), None, "abort")
            self._syncs += 1
            raise
        self._send_frame(_END, b"", None, "end marker")
        self._syncs += 1
        return {
            "weight_sync_bytes": float(sent_bytes),
            "weight_sync_buckets": float(buckets),
            "weight_sync_s": time.perf_counter() - start,
        }

    # ---------------------------------------------------------------------------- receivers

    def receive(self) -> Iterator[tuple[str, Tensor]]:
        """Ranks >= 1: a generator of (name, tensor) in the source's order, bucket by bucket as they
        arrive, until the source's end marker. Nothing is read until it is iterated; read it to its end
        (feed it to `update_weights`). The tensors are views of one fresh buffer per bucket on `device`."""
        if self.rank == 0:
            raise ValueError("WeightBus.receive: rank 0 is the source; it sends")
        self._check_usable()
        return self._receive()

    def _receive(self) -> Iterator[tuple[str, Tensor]]:
        self._check_usable()  # again: another receive() may have run between the call and the first next()
        finished = False
        try:
            bucket = 0
            while True:
                what = f"bucket {bucket} (or the end marker)"
                control = torch.empty(4, dtype=torch.int64, device=self.device)
                self._broadcast(control, f"{what} control")
                kind, sync, header_bytes, payload_bytes = control.tolist()
                if sync != self._syncs:
                    self._broken = f"the source sent sync {sync} while this rank expected sync {self._syncs}"
                    raise self._error(self._broken)
                header = b""
                if header_bytes:
                    raw = torch.empty(header_bytes, dtype=torch.uint8, device=self.device)
                    self._broadcast(raw, f"{what} header")
                    header = raw.cpu().numpy().tobytes()
                if kind == _END:
                    finished = True
                    self._syncs += 1
                    return
                if kind == _ABORT:
                    finished = True
                    self._syncs += 1
                    raise self._error(f"the source aborted sync {sync}: {header.decode(errors='replace')}")
                if kind != _BUCKET:
                    self._broken = f"unknown frame kind {kind}"
                    raise self._error(self._broken)
                payload = torch.empty(payload_bytes, dtype=torch.uint8, device=self.device)
                if payload_bytes:
                    self._broadcast(payload, f"bucket {bucket} payload")
                for name, dtype_name, shape, offset in json.loads(header):
                    dtype = _dtype(dtype_name)
                    nbytes = torch.Size(shape).numel() * dtype.itemsize
                    yield name, payload[offset : offset + nbytes].view(dtype).view(shape)
                bucket += 1
        finally:
            if not finished and self._broken is None:
                self._broken = f"a receive() of sync {self._syncs} stopped before the end marker"

    # -------------------------------------------------------------------------------- close

    def close(self) -> None:
        """Local and idempotent. Close the receivers before the source: the source hosts the store."""
        pg, self._pg = getattr(self, "_pg", None), None
        if pg is not None and hasattr(pg, "shutdown"):
            with contextlib.suppress(Exception):  # closing after a failure: nothing left to tell anyone
                pg.shutdown()
        self._store = None

    def __enter__(self) -> WeightBus:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _broadcast_options():
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    return opts
