"""The code scorer (rewards/scorers/code.py): programs run on a row's test cases, locally or on Sandbox Fusion.

Sandbox Fusion is a service that cannot run here: `FakeSandbox` below stands in for it, a real HTTP server on
localhost that answers run_code requests in Sandbox Fusion's response format by running the program locally. It
checks what Tandem sends and what it does with each kind of answer, not Sandbox Fusion itself.
"""

from __future__ import annotations

import json
import pickle
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_manager import CharTokenizer, make_batch

from tandem.config import ConfigError, load_config
from tandem.config.verl.translate import translate_overrides
from tandem.rewards import RewardManager
from tandem.rewards.from_config import code_scorer_kwargs
from tandem.rewards.scorers.code import check_code_truth, code_score, extract_code, run_local

ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
CASES = {"inputs": ["1 2\n", "3 4\n", "5 5\n"], "outputs": ["3\n", "7\n", "11\n"]}  # the last is wrong


def test_the_program_is_the_last_python_block_or_the_first_fenced_one():
    assert extract_code("think\n```python\nx = 1\n```\nthen\n```python\nprint(2)\n```") == "\nprint(2)\n"
    assert extract_code("```py\nprint(1)\n```") == "print(1)\n"  # the language line dropped
    assert extract_code("```\nprint(1)\n```") == "\nprint(1)\n"
    assert extract_code("print(1)") is None


def test_the_score_is_the_share_of_passed_cases_run_locally():
    result = code_score("codecontests", ADD, json.dumps(CASES))
    assert result == {"score": 2 / 3, "passed": 2, "cases": 3, "status": "wrong_answer"}
    assert code_score("apps", "no code here", CASES)["score"] == 0.0
    crash = code_score("taco", "```python\nraise SystemExit(3)\n```", CASES)
    assert crash == {"score": 0.0, "passed": 0, "cases": 3, "status": "runtime_error"}
    twelve = {"inputs": ["1 1\n"] * 12, "outputs": ["2"] * 10 + ["0", "0"]}  # only the first 10 count
    assert code_score("codeforces", ADD, twelve) == {
        "score": 1.0,
        "passed": 10,
        "cases": 10,
        "status": "passed",
    }


def test_a_function_case_calls_fn_name_or_the_solution_method_with_json_arguments():
    solution = (
        "```python\nclass Solution:\n    def pair(self, xs, k):\n        return [x * k for x in xs]\n```"
    )
    cases = {"fn_name": "pair", "inputs": [[[1, 2], 3], [[0], 5]], "outputs": [[3, 6], [1]]}
    assert code_score("apps", solution, cases) == {
        "score": 0.5,
        "passed": 1,
        "cases": 2,
        "status": "wrong_answer",
    }
    plain = "```python\ndef add(a, b):\n    return a + b\n```"
    assert code_score("apps", plain, {"fn_name": "add", "inputs": ["1\n2"], "outputs": [3]})["score"] == 1.0


def test_a_program_over_its_time_or_memory_limit_fails_its_case():
    assert run_local("while True: pass", "", timeout_s=0.5, memory_limit_mb=0).status == "timeout"
    hog = run_local("x = bytearray(400 << 20)", "", timeout_s=10, memory_limit_mb=200)
    assert hog.status == "error" and "MemoryError" not in hog.stdout
    assert run_local("x = bytearray(50 << 20)", "", timeout_s=10, memory_limit_mb=200).status == "finished"


def test_bad_test_cases_are_named_when_the_data_loads():
    assert check_code_truth("apps", CASES) is None
    assert "not JSON" in check_code_truth("apps", "{inputs")
    assert "as many" in check_code_truth("apps", {"inputs": ["1"], "outputs": []})
    assert "must be test cases" in check_code_truth("apps", [1, 2])


class FakeSandbox:
    """A stand-in for Sandbox Fusion's run_code endpoint (see the module docstring). `busy`: how many requests
    answer 504 first; `requests`: what was posted; `peak`: the most requests in flight at once."""

    def __init__(self, busy: int = 0, status: int = 200) -> None:
        self.busy, self.status = busy, status
        self.requests: list[dict] = []
        self.in_flight = self.peak = 0
        self.lock = threading.Lock()
        box = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with box.lock:
                    box.requests.append(body)
                    box.in_flight += 1
                    box.peak = max(box.peak, box.in_flight)
                    code = 504 if box.busy > 0 else box.status
                    box.busy -= 1
                time.sleep(0.05)
                if code == 200:
                    run = run_local(body["code"], body["stdin"], body["run_timeout"], body["memory_limit_MB"])
                    answer = {
                        "status": "Success" if run.status == "finished" else "Failed",
                        "run_result": {
                            "status": "TimeLimitExceeded" if run.status == "timeout" else "Finished",
                            "return_code": run.return_code,
                            "stdout": run.stdout,
                        },
                    }
                    payload = json.dumps(answer).encode()
                else:
                    payload = b"busy"
                with box.lock:
                    box.in_flight -= 1
                self.send_response(code)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/run_code"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_on_sandbox_fusion_the_score_equals_the_local_one_and_max_concurrent_bounds_the_cases_in_flight():
    box = FakeSandbox()
    try:
        six = {"inputs": ["1 2\n"] * 6, "outputs": ["3"] * 5 + ["4"]}
        remote = code_score(
            "codecontests", ADD, six, sandbox_url=box.url, max_concurrent=2, memory_limit_mb=512
        )
        assert (
            remote
            == code_score("codecontests", ADD, six)
            == {
                "score": 5 / 6,
                "passed": 5,
                "cases": 6,
                "status": "wrong_answer",
            }
        )
        assert len(box.requests) == 6 and box.peak == 2
        sent = box.requests[0]
        assert sent["language"] == "python" and sent["stdin"] == "1 2\n" and sent["memory_limit_MB"] == 512
        assert "print(a + b)" in sent["code"] and sent["run_timeout"] == 10.0
    finally:
        box.close()


def test_a_busy_sandbox_is_asked_again_and_a_failing_one_is_an_error_not_a_wrong_answer():
    busy = FakeSandbox(busy=1)
    try:
        assert (
            code_score("apps", ADD, {"inputs": ["2 2"], "outputs": ["4"]}, sandbox_url=busy.url)["score"] == 1
        )
        assert len(busy.requests) == 2  # a 504, then the answer
    finally:
        busy.close()
    broken = FakeSandbox(status=500)
    try:
        with pytest.raises(RuntimeError, match=r"Sandbox Fusion at http://127.0.0.1:\d+/run_code .*HTTP 500"):
            code_score("apps", ADD, CASES, sandbox_url=broken.url)
    finally:
        broken.close()


def test_verls_sandbox_keys_reach_the_scorer_the_reward_manager_sends_to_its_processes():
    cfg = load_config(
        "verl",
        [
            "reward_model.sandbox_fusion.url=http://127.0.0.1:1/run_code",
            "reward_model.sandbox_fusion.max_concurrent=8",
            "reward_model.sandbox_fusion.memory_limit_mb=256",
            "reward.num_workers=2",
        ],
    )
    assert code_scorer_kwargs(cfg) == {
        "sandbox_url": "http://127.0.0.1:1/run_code",
        "max_concurrent": 4,  # shared by the 2 scoring processes
        "memory_limit_mb": 256,
    }
    assert translate_overrides(["reward_model.sandbox_fusion.url=null"]).problems == []
    with pytest.raises(ConfigError, match="reward.sandbox_fusion.url='ftp://x' is not an http"):
        load_config("verl", ["reward_model.sandbox_fusion.url=ftp://x"])
    box = FakeSandbox()
    try:
        kwargs = {"sandbox_url": box.url, "max_concurrent": 1, "memory_limit_mb": 256}
        batch = make_batch([ADD, ADD], ["codecontests", "taco"], [json.dumps(CASES), CASES])
        with RewardManager(CharTokenizer(), num_workers=0, scorer_kwargs={"code": kwargs}) as manager:
            result = manager(batch)
            key, spec = manager._scorer_for("taco", None)
        assert result.scores.tolist() == pytest.approx([2 / 3, 2 / 3])
        assert len(box.requests) == 6  # every case went to the sandbox
        # what a scoring process receives: the bound scorer, pickled by reference, under a stable name
        sent = pickle.loads(pickle.dumps(spec))
        assert sent("apps", ADD, CASES, None)["score"] == pytest.approx(2 / 3) and len(box.requests) == 9
        assert (
            key
            == f"tandem.rewards.scorers.code.code_score(max_concurrent=1, memory_limit_mb=256, sandbox_url='{box.url}')"
        )
    finally:
        box.close()
