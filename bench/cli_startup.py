"""How quickly the command line answers: `tandem presets` and `tandem config grpo`, each in a fresh process.

    .venv/bin/python bench/cli_startup.py               # median of 3 runs per command
    .venv/bin/python bench/cli_startup.py --runs 5

For each command: wall seconds, CPU seconds (user + system of the child) and peak RSS, the median of
`--runs` runs, and, from one more run, how many modules the process imported and which of the heavy
packages (torch, transformers, tensordict, vllm, ray) among them. The targets are printed beside the
numbers, not asserted (tests/test_cli_imports.py asserts on the imported modules, never on time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HEAVY = ("torch", "transformers", "tensordict", "vllm", "ray")
COMMANDS = {  # command line -> target wall seconds on the 2-core CPU machine
    "presets": 1.0,
    "config grpo": 3.0,
}


def _tandem(args: list[str]) -> list[str]:
    """What the console script `tandem` runs, in a fresh interpreter."""
    return [sys.executable, "-c", "from tandem.cli import main; raise SystemExit(main())", *args]


def run_once(args: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one `tandem ARGS` in a child process."""
    start = time.perf_counter()
    child = subprocess.Popen(_tandem(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"tandem {' '.join(args)} exited {child.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # ru_maxrss: KiB on Linux


def imported(args: list[str]) -> tuple[int, str]:
    """(number of modules in sys.modules at exit, the heavy packages among them) for `tandem ARGS`."""
    script = (
        "import atexit, sys\n"
        f"HEAVY = set({HEAVY!r})\n"
        "def report():\n"
        "    heavy = sorted({m.split('.')[0] for m in sys.modules} & HEAVY)\n"
        '    print(f\'MODULES {len(sys.modules)} {",".join(heavy) or "none"}\', file=sys.stderr)\n'
        "atexit.register(report)\n"
        "from tandem.cli import main\n"
        "raise SystemExit(main())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=True
    ).stderr
    line = [text for text in out.splitlines() if text.startswith("MODULES ")][-1]
    _, count, heavy = line.split(" ", 2)
    return int(count), heavy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=int, default=3, help="runs per command (default: 3; the median is shown)"
    )
    runs = parser.parse_args().runs
    print(f"tandem's start-up, median of {runs} runs per command; load average {os.getloadavg()[0]:.2f}")
    print(
        f"{'command':<22}{'wall s':>8}{'CPU s':>8}{'RSS MiB':>9}{'modules':>9}  heavy imported{'':<20}target"
    )
    for command, target in COMMANDS.items():
        args = command.split()
        samples = [run_once(args) for _ in range(runs)]
        wall, cpu, rss = (statistics.median(column) for column in zip(*samples))
        count, heavy = imported(args)
        print(
            f"tandem {command:<15}{wall:>8.2f}{cpu:>8.2f}{rss:>9.0f}{count:>9}  {heavy:<34}wall < {target:g} s"
        )


if __name__ == "__main__":
    main()
