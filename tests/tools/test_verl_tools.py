"""verl's tool YAML and stateful tool life cycle: the YAML builds the right tool, the GSM8K port gives
verl's step rewards, and a row's tools_kwargs reach create / execute / calc_reward / release, with
release on every path (answer, error, timeout, cancelled)."""

import asyncio
import textwrap

import pytest
from verl_rows import TOOL_NAME, TOOL_YAML

from tandem.tools import StatefulTool, ToolSession, ToolSet, build_toolset, load_tools
from tandem.tools.gsm8k import NOT_IMPROVED_PENALTY, Gsm8kTool


def test_the_yaml_builds_the_ported_gsm8k_tool_with_its_schema_and_config():
    (gsm8k,) = load_tools(TOOL_YAML)
    assert isinstance(gsm8k, Gsm8kTool) and gsm8k.name == TOOL_NAME
    assert gsm8k.config == {"type": "native"}
    assert gsm8k.description == "Scores an answer to a GSM8K problem: 1.0 when it is right, else 0.0"
    assert gsm8k.parameters == {
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "The answer, a number"}},
        "required": ["answer"],
    }
    assert gsm8k.schema()["function"]["name"] == TOOL_NAME


def session_calls(tools: ToolSet, tools_kwargs: dict, calls: list[tuple[str, dict]]):
    """Run `calls` in one session, then close it: (results, rewards of close)."""

    async def go():
        session = ToolSession(tools, tools_kwargs)
        results = [await session.run(name, arguments) for name, arguments in calls]
        return results, await session.close()

    return asyncio.run(go())


def test_gsm8k_step_rewards_follow_verls_rule():
    tools = build_toolset([], TOOL_YAML)
    answers = ["5", "72", "72", "9", "#### 72"]
    results, final = session_calls(
        tools,
        {TOOL_NAME: {"create_kwargs": {"ground_truth": "72"}}},
        [(TOOL_NAME, {"answer": a}) for a in answers],
    )
    # scores 0, 1, 1, 0, 1: a step scores 0.0 only when it beats the previous answer (the first beats 0.0)
    assert [r.reward for r in results] == [NOT_IMPROVED_PENALTY, 0.0, -0.05, -0.05, 0.0]
    assert [r.error for r in results] == [None] * 5
    assert results[0].text == "parsed answer '5': reward 0.0"
    assert results[1].text == "parsed answer '72': reward 1.0"
    assert final == {TOOL_NAME: 1.0}  # calc_reward: the last answer's score


def test_the_gsm8k_tool_reads_answers_as_verl_does():
    """verl's tool scores with its flexible rule: the last number as written, compared as text."""
    tools = build_toolset([], TOOL_YAML)
    calls = [(TOOL_NAME, {"answer": a}) for a in ("it is 3, no: 72", "1,234", "72.0")]
    results, _ = session_calls(tools, {TOOL_NAME: {"create_kwargs": {"ground_truth": "72"}}}, calls[:1])
    assert results[0].text.endswith("reward 1.0")
    results, _ = session_calls(tools, {TOOL_NAME: {"create_kwargs": {"ground_truth": "1234"}}}, calls[1:2])
    assert results[0].text.endswith("reward 0.0")  # the comma is kept, as in verl
    results, _ = session_calls(tools, {TOOL_NAME: {"create_kwargs": {"ground_truth": "72"}}}, calls[2:])
    assert results[0].text.endswith("reward 0.0")  # "72.0" is not "72" as text, as in verl


RECORDER = '''
import asyncio

LOG = []


class Recorder:
    """Records every life-cycle call with its arguments (a plain class: verl's methods, duck-typed)."""

    def __init__(self, config, tool_schema):
        self.config, self.schema = config, tool_schema

    async def create(self, instance_id, **kwargs):
        LOG.append(("create", instance_id, kwargs))

    async def execute(self, instance_id, parameters, **kwargs):
        LOG.append(("execute", instance_id, parameters, kwargs))
        if parameters["x"] == "raise":
            raise RuntimeError("broken")
        if parameters["x"] == "sleep":
            await asyncio.sleep(5)
        return f"got {parameters['x']}", 0.5, {"n": 1}

    def calc_reward(self, instance_id, **kwargs):  # sync methods work too
        LOG.append(("calc_reward", instance_id, kwargs))
        return 2.0

    async def release(self, instance_id, **kwargs):
        LOG.append(("release", instance_id, kwargs))
'''

RECORDER_YAML = """
tools:
  - class_name: {module}.Recorder
    config: {{type: native, level: 3}}
    tool_schema:
      type: function
      function:
        name: recorder
        description: Records.
        parameters: {{type: object, properties: {{x: {{type: string}}}}, required: [x]}}
"""


@pytest.fixture
def recorder(tmp_path, monkeypatch, request):
    module = f"recorder_{request.node.name.replace('[', '_').replace(']', '_').replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(RECORDER)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "tools.yaml"
    path.write_text(RECORDER_YAML.format(module=module))
    tools = build_toolset([], path, timeout_s=0.2)
    log = __import__(module).LOG
    return tools, log


KWARGS = {
    "recorder": {
        "create_kwargs": {"ground_truth": "7"},
        "execute_kwargs": {"mode": "fast"},
        "calc_reward_kwargs": {"scale": 2},
        "release_kwargs": {"why": "done"},
    }
}


def test_a_dotted_class_gets_its_config_and_the_rows_kwargs_at_each_step(recorder):
    tools, log = recorder
    assert tools["recorder"].target.config == {"type": "native", "level": 3}
    results, final = session_calls(tools, KWARGS, [("recorder", {"x": "a"}), ("recorder", {"x": "b"})])
    assert [(r.text, r.reward, r.error) for r in results] == [("got a", 0.5, None), ("got b", 0.5, None)]
    assert final == {"recorder": 2.0}
    instance = log[0][1]
    assert log == [
        # once per trajectory; verl's agent loop passes them as one dict too, so a class of either kind reads them
        ("create", instance, {"ground_truth": "7", "create_kwargs": {"ground_truth": "7"}}),
        ("execute", instance, {"x": "a"}, {"mode": "fast"}),
        ("execute", instance, {"x": "b"}, {"mode": "fast"}),
        ("calc_reward", instance, {"scale": 2}),
        ("release", instance, {"why": "done"}),
    ]


@pytest.mark.parametrize(("x", "error"), [("raise", "raised"), ("sleep", "timeout")])
def test_an_instance_is_released_after_an_error_or_a_timeout(recorder, x, error):
    tools, log = recorder
    results, _ = session_calls(tools, KWARGS, [("recorder", {"x": x})])
    assert results[0].error == error and results[0].reward is None
    assert [entry[0] for entry in log] == ["create", "execute", "calc_reward", "release"]


def test_an_instance_is_released_when_the_trajectory_is_cancelled(recorder):
    tools, log = recorder

    async def go():
        async def trajectory():
            async with ToolSession(tools, KWARGS) as session:
                await session.run("recorder", {"x": "sleep"})

        task = asyncio.create_task(trajectory())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert [entry[0] for entry in log] == ["create", "execute", "calc_reward", "release"]


class Faulty(StatefulTool):
    """Fails where it is told to."""

    def __init__(self, fail: str):
        super().__init__(tool_schema={"function": {"name": "faulty", "parameters": {"type": "object"}}})
        self.fail, self.released = fail, []

    async def create(self, instance_id, **kwargs):
        if self.fail == "create":
            raise ValueError("no state")

    async def execute(self, instance_id, parameters, **kwargs):
        return {"create": ("x", 0.0, {}), "result": "not a tuple", "reward": ("x", "high", {})}[self.fail]

    async def release(self, instance_id, **kwargs):
        self.released.append(instance_id)
        raise OSError("release failed")  # logged and counted, never raised


@pytest.mark.parametrize(
    ("fail", "error", "text"),
    [
        ("create", "raised", "error: ValueError: no state"),
        (
            "result",
            "bad_result",
            "error: tool 'faulty': execute must return (text, step_reward, metrics), got str",
        ),
        (
            "reward",
            "bad_result",
            "error: tool 'faulty': execute's step reward must be a finite number or None",
        ),
    ],
)
def test_nothing_a_stateful_tool_does_wrong_raises_out_of_the_session(fail, error, text):
    tool = Faulty(fail)
    results, final = session_calls(ToolSet([tool]), {}, [("faulty", {})])
    assert results[0].error == error and results[0].text.startswith(text)
    assert len(tool.released) == 1 and final == {"faulty": 0.0}


def test_plain_tools_ignore_tools_kwargs_and_stateful_ones_run_alone_outside_a_session():
    tools = build_toolset(["calculator"], TOOL_YAML)
    results, final = session_calls(
        tools, {"calculator": {"create_kwargs": {"x": 1}}}, [("calculator", {"expression": "6*7"})]
    )
    assert (results[0].text, results[0].reward, final) == ("42", None, {})
    # ToolSet.run outside a trajectory: one instance for the call (no ground truth: scores 0)
    alone = asyncio.run(tools.run(TOOL_NAME, {"answer": "3"}))
    assert alone.text == "parsed answer '3': reward 0.0" and alone.error is None


def test_a_tool_file_of_both_kinds_loads_by_suffix(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        textwrap.dedent(
            """
            from tandem.tools import tool

            @tool
            def echo(text: str) -> str:
                '''Echoes.'''
                return text
            """
        )
    )
    assert [t.name for t in load_tools(path)] == ["echo"]
    assert [t.name for t in load_tools(TOOL_YAML)] == [TOOL_NAME]
