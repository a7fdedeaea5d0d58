import asyncio
import os
import time

import pytest

from tandem.tools import PythonTool, ToolSet, build_toolset


def run_code(code, timeout_s=5.0, **limits):
    toolset = ToolSet([PythonTool(timeout_s=timeout_s, **limits)], timeout_s=30, max_result_chars=2000)
    return asyncio.run(toolset.run("python", {"code": code}))


def gone(pid, wait_s=3.0):
    """Whether process `pid` has ended (a zombie left to a reaper outside our control counts)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_prints_output():
    result = run_code("print(6*7)")
    assert (result.text, result.error) == ("42", None)


def test_stdout_then_stderr_then_the_exit_code():
    result = run_code("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert result.text == "out\nerr\nexit code 3"


def test_an_exception_shows_the_traceback_end_and_exit_code():
    result = run_code("x = 1\n1/0")
    assert result.error is None
    assert result.text.endswith(
        'File "<code>", line 2, in <module>\nZeroDivisionError: division by zero\nexit code 1'
    )


def test_no_output():
    assert run_code("x = 1").text == "(no output)"


def test_runs_in_a_fresh_empty_directory_with_a_minimal_environment():
    code = "import os, sys\nprint(os.getcwd())\nprint(os.listdir('.'))\nprint(sorted(os.environ))\nprint(sys.flags.isolated)"
    cwd, listing, env, isolated = run_code(code).text.splitlines()
    assert cwd != os.getcwd() and listing == "[]" and isolated == "1"
    assert env == "['HOME', 'LC_ALL', 'PATH']"
    assert not os.path.exists(cwd)  # deleted after the call


def test_an_infinite_loop_is_killed_at_the_tools_own_limit(tmp_path):
    pids = tmp_path / "pids"
    code = (
        "import os, subprocess\n"
        "child = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "while True:\n    pass\n"
    )
    start = time.perf_counter()
    result = run_code(code, timeout_s=2.0)  # the toolset allows 30 s
    assert (result.error, result.text) == ("timeout", "error: the tool did not answer within 2 s")
    assert time.perf_counter() - start < 20  # the tool's own limit, not the toolset's
    pid, child = map(int, pids.read_text().split())
    with pytest.raises(ProcessLookupError):  # killed and reaped: not even a zombie
        os.kill(pid, 0)
    assert gone(child)  # the whole process group was killed


def test_a_cancelled_call_kills_the_process(tmp_path):
    pids = tmp_path / "pid"
    code = f"import os, time\nopen({str(pids)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)"

    async def cancel_soon():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(PythonTool(timeout_s=30).call(code=code), 0.5)

    asyncio.run(cancel_soon())
    with pytest.raises(ProcessLookupError):
        os.kill(int(pids.read_text()), 0)


def test_a_memory_bomb_fails_fast_instead_of_hanging():
    start = time.perf_counter()
    result = run_code("block = bytearray(4 << 30)", memory_bytes=512 << 20)
    assert result.text.endswith("MemoryError\nexit code 1")
    assert time.perf_counter() - start < 5


def test_a_big_file_hits_the_file_size_limit():
    result = run_code("open('big', 'wb').write(b'x' * (2 << 20))", file_bytes=1 << 20)
    assert result.text.endswith("OSError: [Errno 27] File too large\nexit code 1")


def test_build_toolset_gives_the_python_tool_the_toolset_limit():
    toolset = build_toolset(["python"], timeout_s=3)
    assert toolset["python"].timeout_s == 3.0


# Forks 20 plain children (the code's own process group), one that starts a session of its own and
# one double-forked daemon (its parent exits at once); each sleeps, then writes a file in `folder`.
# The code then writes `ready` and either returns or sleeps past every limit.
FORKS = """\
import os, sys, time
folder, marker = {folder!r}, {marker!r}
def later(name):
    time.sleep({sleep_s})
    open(os.path.join(folder, name), 'w').write('outlived the call')
    os._exit(0)
for i in range(20):
    if os.fork() == 0:
        later(f'plain-{{i}}')
if os.fork() == 0:
    os.setsid()
    later('new-session')
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        later('double-fork')
    os._exit(0)
open(os.path.join(folder, 'ready'), 'w').write('')
{end}
"""


def alive_with(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (a forked child keeps its parent's)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state != "Z":
            pids.append(int(entry))
    return pids


def forks(folder, end: str, sleep_s: float = 1.5) -> tuple[str, str]:
    marker = f"tandem-test-{os.getpid()}-{time.monotonic_ns()}"
    return FORKS.format(folder=str(folder), marker=marker, end=end, sleep_s=sleep_s), marker


def assert_nothing_outlived(folder, marker, sleep_s: float = 1.5):
    assert alive_with(marker) == []  # right after the call: every process of it is dead
    time.sleep(sleep_s + 1)  # past the children's sleep: none of them wrote its file
    assert sorted(p.name for p in folder.iterdir() if p.name != "ready") == []


@pytest.mark.parametrize("how", ["normal_end", "timeout"])
def test_no_child_outlives_a_call_that_ends_or_times_out(tmp_path, how):
    sleep_s = 1.5 if how == "normal_end" else 4.0  # the children sleep past the 2 s limit
    code, marker = forks(tmp_path, "" if how == "normal_end" else "time.sleep(60)", sleep_s)
    result = run_code(code, timeout_s=30 if how == "normal_end" else 2)
    expected = {
        "normal_end": ("(no output)", None),
        "timeout": ("error: the tool did not answer within 2 s", "timeout"),
    }
    assert (result.text, result.error) == expected[how]
    assert_nothing_outlived(tmp_path, marker, sleep_s)


def test_no_child_outlives_a_cancelled_call(tmp_path):
    code, marker = forks(tmp_path, "time.sleep(60)")

    async def cancel_when_ready():
        call = asyncio.ensure_future(PythonTool(timeout_s=60).call(code=code))
        while not (tmp_path / "ready").exists():
            await asyncio.sleep(0.02)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(cancel_when_ready())
    assert_nothing_outlived(tmp_path, marker)


@pytest.mark.parametrize("steps", [1, 2, 3, 5, 8])
def test_a_cancellation_in_the_first_event_loop_steps_leaves_no_process(tmp_path, steps):
    """Cancelled while its process is starting (after 1, 2, ... turns of the event loop): the kill is armed
    from the first step, so no process of the call is alive when it returns."""
    code, marker = forks(tmp_path, "time.sleep(60)")

    async def cancel_early():
        call = asyncio.ensure_future(PythonTool(timeout_s=60).call(code=code))
        for _ in range(steps):
            await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(cancel_early())
    assert alive_with(marker) == []
    assert not any(p.name.startswith(("plain", "new", "double")) for p in tmp_path.iterdir())
