"""Code scorer: run the response's program on a row's test cases and score the share it passes.

Used for verl's code data_sources (codecontests, apps, codeforces, taco), as verl's default scorer uses them:

- The program is the response's last ```python block (else its first ``` block, a language line dropped); a
  response without a code block scores 0.
- The ground truth is a JSON object (or its text) with "inputs" and "outputs" lists: stdin / expected stdout per
  case, compared after dropping trailing newlines. With "fn_name", each input is the function's arguments as JSON
  lines and the output its return value: the program's `fn_name` (or `Solution().fn_name`) is called, and its
  result printed as JSON (containers, None, bools) or as str.
- The score is the share of the first 10 cases that pass (verl's `continuous=True`); the result's fields say how
  many cases ran and passed and the first failing case's status.

Where the program runs: `sandbox_url` set (reward.sandbox_fusion.url, verl's reward_model.sandbox_fusion.url) =
Sandbox Fusion's `run_code` API (https://github.com/bytedance/SandboxFusion), with at most `max_concurrent` cases
in flight from this process; unset = a local `python -I` subprocess per case in a temporary folder, with a time
limit and an address-space limit. The local path is NOT a security sandbox: run models' code on machines you can
lose, or use Sandbox Fusion. Where Sandbox Fusion cannot be reached (after retries on HTTP 504), the sample is an
error, not a wrong answer: verl scores it 0 silently, Tandem reports it (rewards/manager.py counts and logs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from tandem.rewards.registry import register_scorer

CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco")
MAX_CASES = 10  # the score is the pass rate over the first MAX_CASES cases (verl's continuous score)
RETRIES = 3  # Sandbox Fusion answers 504 when it is busy: try again, after 1 s, 2 s
STATUSES = ("passed", "wrong_answer", "runtime_error", "timeout")

# Runs the user's program, then calls its function with each JSON line of stdin as one argument.
_CALL_WRAPPER = """
{program}

import json as _json, sys as _sys
_args = [_json.loads(_line) for _line in _sys.stdin.read().splitlines() if _line.strip()]
_fn = globals().get({fn_name!r})
if _fn is None and "Solution" in globals():
    _fn = getattr(Solution(), {fn_name!r})
_result = _fn(*_args)
print(_json.dumps(_result) if isinstance(_result, (dict, list, tuple, bool)) or _result is None else _result)
"""


class TestCases(NamedTuple):
    inputs: list[Any]
    outputs: list[Any]
    fn_name: str | None


class Run(NamedTuple):
    status: str  # "finished", "timeout" or "error" (the program's own failure)
    stdout: str
    return_code: int | None


def extract_code(text: str) -> str | None:
    """The program in a response: its last ```python block, else its first ``` block; None without one."""
    if "```python" in text:
        return text.split("```python")[-1].split("```")[0]
    parts = text.split("```")
    if len(parts) < 3:
        return None
    block = parts[1]
    first, _, rest = block.partition("\n")
    return rest if first.strip().isalpha() else block  # a language name on the fence's line


def parse_cases(ground_truth: Any) -> TestCases:
    """A row's test cases; ValueError naming what is wrong with them."""
    cases = ground_truth
    if isinstance(cases, str | bytes):
        try:
            cases = json.loads(cases)
        except json.JSONDecodeError as err:
            raise ValueError(f"the ground truth is not JSON test cases ({err})") from None
    if not isinstance(cases, dict) or not {"inputs", "outputs"} <= set(cases):
        raise ValueError('the ground truth must be test cases {"inputs": [...], "outputs": [...]}')
    inputs, outputs = list(cases["inputs"]), list(cases["outputs"])
    if len(inputs) != len(outputs) or not inputs:
        raise ValueError(
            f"the test cases have {len(inputs)} inputs and {len(outputs)} outputs (need as many, >= 1)"
        )
    fn_name = cases.get("fn_name")
    return TestCases(inputs, outputs, str(fn_name) if fn_name else None)


def check_code_truth(data_source: str, ground_truth: Any) -> str | None:
    """The scorer's ground-truth check (registry): None when the row's test cases can be run."""
    try:
        parse_cases(ground_truth)
    except ValueError as err:
        return str(err)
    return None


def _stdin(case_input: Any, fn_name: str | None) -> str:
    if fn_name is None:
        return case_input if isinstance(case_input, str) else str(case_input)
    if isinstance(case_input, str):  # already JSON lines, one argument each
        return case_input
    return "\n".join(json.dumps(arg) for arg in case_input)  # a list of arguments


def _expected(output: Any, fn_name: str | None) -> str:
    if fn_name is not None and not isinstance(output, str):
        return json.dumps(output)
    return str(output)


def run_local(program: str, stdin: str, timeout_s: float, memory_limit_mb: int) -> Run:
    """One case in a `python -I` subprocess (no user site, no PYTHON* variables) in a fresh temporary folder; the
    program's first line limits its address space to `memory_limit_mb` (0 = no limit)."""
    if memory_limit_mb > 0:
        limit = memory_limit_mb << 20
        program = f"import resource as _r; _r.setrlimit(_r.RLIMIT_AS, ({limit}, {limit}))\n{program}"
    with tempfile.TemporaryDirectory(prefix="tandem_code_") as folder:
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-c", program],
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                cwd=folder,
                env={"PATH": os.environ.get("PATH", ""), "HOME": folder},
            )
        except subprocess.TimeoutExpired:
            return Run("timeout", "", None)
    return Run("finished" if done.returncode == 0 else "error", done.stdout, done.returncode)


def run_sandbox(url: str, program: str, stdin: str, timeout_s: float, memory_limit_mb: int) -> Run:
    """One case on Sandbox Fusion's run_code API. RuntimeError when the service fails (not the program)."""
    request = json.dumps(
        {
            "code": program,
            "stdin": stdin,
            "language": "python",
            "compile_timeout": timeout_s,
            "run_timeout": timeout_s,
            "memory_limit_MB": memory_limit_mb,
        }
    ).encode()
    answer: Any = None
    error = ""
    for attempt in range(RETRIES):
        post = urllib.request.Request(url, data=request, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(post, timeout=2 * timeout_s + 30) as response:
                answer = json.loads(response.read())
            break
        except urllib.error.HTTPError as err:
            error = f"HTTP {err.code}"
            if err.code != 504:
                break
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as err:
            error = f"{type(err).__name__}: {err}"
            break
        if attempt + 1 < RETRIES:
            time.sleep(attempt + 1)
    if not isinstance(answer, dict):
        raise RuntimeError(f"Sandbox Fusion at {url} did not run the case ({error or repr(answer)})")
    result = answer.get("run_result") or {}
    if answer.get("status") == "SandboxError":
        raise RuntimeError(f"Sandbox Fusion at {url} failed: {answer.get('message', answer)!r}")
    if result.get("status") == "TimeLimitExceeded":
        return Run("timeout", "", None)
    finished = answer.get("status") == "Success" and result.get("status") == "Finished"
    code = result.get("return_code")
    return Run("finished" if finished and code in (0, None) else "error", result.get("stdout") or "", code)


def code_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    sandbox_url: str | None = None,
    max_concurrent: int = 1,
    memory_limit_mb: int = 1024,
    case_timeout_s: float = 10.0,
) -> dict[str, Any]:
    """The pass rate of the response's program over the row's first MAX_CASES test cases (module docstring)."""
    cases = parse_cases(ground_truth)
    program = extract_code(solution_str)
    count = min(len(cases.inputs), MAX_CASES)
    if program is None:
        return {"score": 0.0, "passed": 0, "cases": count, "status": "no_code_block"}
    if cases.fn_name is not None:
        program = _CALL_WRAPPER.format(program=program, fn_name=cases.fn_name)

    def one(i: int) -> str:
        stdin = _stdin(cases.inputs[i], cases.fn_name)
        if sandbox_url:
            run = run_sandbox(sandbox_url, program, stdin, case_timeout_s, memory_limit_mb)
        else:
            run = run_local(program, stdin, case_timeout_s, memory_limit_mb)
        if run.status != "finished":
            return "timeout" if run.status == "timeout" else "runtime_error"
        expected = _expected(cases.outputs[i], cases.fn_name)
        return "passed" if run.stdout.rstrip("\n") == expected.rstrip("\n") else "wrong_answer"

    with ThreadPoolExecutor(max_workers=max(1, min(max_concurrent, count))) as pool:
        statuses = list(pool.map(one, range(count)))
    passed = statuses.count("passed")
    failing = next((s for s in statuses if s != "passed"), "passed")
    return {"score": passed / count, "passed": passed, "cases": count, "status": failing}


register_scorer("code", *CODE_SOURCES, check_ground_truth=check_code_truth)(code_score)
