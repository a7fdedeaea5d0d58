"""`param_dtype=auto` on a CPU: bfloat16 where this CPU multiplies bf16 matrices clearly faster than float32.

bf16 pays on CPUs with native bf16 matrix instructions (Intel AMX tiles, AVX-512 BF16), where oneDNN runs
bf16 GEMMs at several times fp32's rate. Elsewhere torch emulates them, hundreds of times slower (a 2-core
AMD EPYC without them: 0.3-1 GFLOP/s in bf16 against 156 in fp32). The hosts this project has run on since
differ: AVX-512 BF16 from 0.55x fp32 (an Intel Xeon, 2 threads, bench/README.md) to 2.2x (an AMD EPYC, one
thread), AMX 5.5x. So:
no native instruction, float32 without timing anything; with one, `cpu_auto_dtype` times both dtypes on a
transformer-like matmul and picks bfloat16 only when it is at least `MARGIN` times faster, since bf16
training also pays for casting the fp32 master weights every step and keeps reductions in fp32.

The probe times CPU time (`time.process_time`) on one torch thread, not wall time: its choice decides every
number of a run, so it must not move with the host's load. Timed by the wall clock, a process that the OS
descheduled during the bf16 matmuls (other runs on the same cores) measured bf16 slower than it is: on a
2-core AVX-512 BF16 host under load the ratio ranged 1.0-5.1 around its 2.2, a rank chose float32 now and
then, and a seeded run differed from the run before it from its first step. In CPU time the same host gave
2.1-2.4 under the same load. One thread: the ratio is a property of the core's instructions, and OpenMP's
other threads (their waiting included) stay out of the count.

`TANDEM_AUTO_CPU_DTYPE=float32|bfloat16` replaces the probe: the test suite pins float32 (its parity tests
compare at 1e-5 and must not change dtype on a host with AMX), and a user can pin one choice across hosts.

One choice per run: the controller probes once (its device line prints the result) and hands its choice to
every Ray worker through that variable (`worker_env`, roles/layout.py), so the actor's ranks, the reference,
the critic and a separate rollout pool compute in the dtype the line says. Each process timing for itself
could disagree with the line and with one another. On a cluster of unlike CPUs the controller's CPU decides
for all: pin the variable (or set param_dtype) there.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

ENV = "TANDEM_AUTO_CPU_DTYPE"
MARGIN = 1.3  # bf16's matmul rate over fp32's needed to choose it
PROBE_SHAPE = (512, 1024, 1024)  # tokens x hidden @ hidden x hidden: 1.07 GFLOP, milliseconds in fp32
_CHOICES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def native_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (AMX tiles or AVX-512 BF16), as torch sees them."""
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def matmul_rate(
    dtype: torch.dtype,
    shape: tuple[int, int, int] = PROBE_SHAPE,
    repeats: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """FLOP/s of `[m, k] @ [k, n]` in `dtype` at torch's current threads: the best of `repeats` after one,
    timed by `clock` (wall time: a device's peak for MFU; `time.process_time`: this process's CPU time)."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(k, n, generator=gen).to(dtype)
    torch.mm(a, b)  # oneDNN's first call picks and builds its kernel
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        torch.mm(a, b)
        best = min(best, clock() - start)
    return 2 * m * k * n / best


def worker_env() -> dict[str, str]:
    """The environment that gives a CPU run's workers this process's `param_dtype=auto` choice."""
    return {ENV: str(cpu_auto_dtype()).removeprefix("torch.")}


def cpu_auto_dtype() -> torch.dtype:
    """float32 or bfloat16 for `param_dtype=auto` on this CPU (the module docstring says how)."""
    pinned = os.environ.get(ENV)
    if pinned:
        if pinned not in _CHOICES:
            raise ValueError(f"{ENV}={pinned!r}: use float32 or bfloat16 (or unset it to let Tandem measure)")
        return _CHOICES[pinned]
    return _probe()


@functools.cache
def _probe() -> torch.dtype:
    if not native_bf16():
        logger.info("param_dtype=auto: float32 (this CPU has no native bf16 matrix instructions)")
        return torch.float32
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU time on one thread: the host's load does not move it (module docstring)
    try:
        fp32, bf16 = (
            matmul_rate(dtype, clock=time.process_time) for dtype in (torch.float32, torch.bfloat16)
        )
    finally:
        torch.set_num_threads(threads)
    choice = torch.bfloat16 if bf16 >= MARGIN * fp32 else torch.float32
    logger.info(
        "param_dtype=auto: %s (matmul %s, one thread, CPU time: fp32 %.0f, bf16 %.0f GFLOP/s; bf16 needs %.1fx fp32; %s=float32 "
        "pins float32)",
        str(choice).removeprefix("torch."),
        "x".join(map(str, PROBE_SHAPE)),
        fp32 / 1e9,
        bf16 / 1e9,
        MARGIN,
        ENV,
    )
    return choice
