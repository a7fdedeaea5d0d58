import asyncio
import time

import pytest

from tandem.tools import BUILTIN_INTERACTIONS, BUILTIN_TOOLS, Calculator, Tool, ToolSet, tool, truncate
from tandem.tools.names import BUILTIN_INTERACTION_NAMES, BUILTIN_TOOL_NAMES

DIGITS = "0123456789" * 10  # 100 characters


class Echo(Tool):
    name = "echo"
    description = "Echoes its arguments."
    parameters = {  # noqa: RUF012
        "type": "object",
        "properties": {"text": {"type": "string"}, "times": {"type": "integer"}, "scale": {"type": "number"}},
        "required": ["text"],
    }

    async def call(self, text, times=1, scale=1.0):
        return text * times


@tool
async def hang() -> str:
    """Never answers."""
    await asyncio.sleep(60)
    return "late"


@tool
def fail(message: str) -> str:
    """Raises."""
    raise RuntimeError(f"{message}\nsecond line")


@tool
def number() -> int:
    """Returns a number, not text."""
    return 7


@tool
def long_text() -> str:
    """Returns 100 characters."""
    return DIGITS


def run(toolset, name, arguments):
    return asyncio.run(toolset.run(name, arguments))


def test_schemas_names_and_membership():
    toolset = ToolSet([Calculator(), Echo()])
    assert toolset.names == ["calculator", "echo"] and len(toolset) == 2
    assert "echo" in toolset and "nope" not in toolset
    assert toolset.schemas()[1] == {
        "type": "function",
        "function": {"name": "echo", "description": "Echoes its arguments.", "parameters": Echo.parameters},
    }


def test_unknown_tool_lists_the_available_ones():
    result = run(ToolSet([Calculator(), Echo()]), "nope", {})
    assert result.error == "unknown_tool"
    assert result.text == "error: unknown tool 'nope'; available tools: calculator, echo"


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        (["hi"], "error: the arguments of tool 'echo' must be a JSON object, got array"),
        ({}, "error: tool 'echo' needs argument 'text' (string)"),
        (
            {"text": "a", "colour": 1},
            "error: tool 'echo' has no argument 'colour'; its arguments: text, times, scale",
        ),
        ({"text": 5}, "error: argument 'text' of tool 'echo' must be string, got integer"),
        ({"text": "a", "times": True}, "error: argument 'times' of tool 'echo' must be integer, got boolean"),
        ({"text": "a", "times": 1.5}, "error: argument 'times' of tool 'echo' must be integer, got number"),
    ],
)
def test_bad_arguments_name_the_key(arguments, text):
    result = run(ToolSet([Echo()]), "echo", arguments)
    assert (result.error, result.text) == ("bad_arguments", text)


def test_good_arguments_run_and_an_int_is_a_number():
    result = run(ToolSet([Echo()]), "echo", {"text": "ab", "times": 2, "scale": 3})
    assert (result.text, result.error, result.truncated) == ("abab", None, False)
    assert result.seconds >= 0


def test_a_raising_tool_gives_its_exception_type_and_first_line():
    result = run(ToolSet([fail]), "fail", {"message": "broken"})
    assert (result.error, result.text) == ("raised", "error: RuntimeError: broken")


def test_a_hanging_tool_times_out_at_the_limit():
    start = time.perf_counter()
    result = run(ToolSet([hang], timeout_s=0.2), "hang", {})
    elapsed = time.perf_counter() - start
    assert (result.error, result.text) == ("timeout", "error: the tool did not answer within 0.2 s")
    # liveness, not speed: the bound is half of what waiting for the hanging tool (60 s) would take
    assert 0.2 <= result.seconds < 30 and elapsed < 30


def test_a_tools_own_timeout_wins():
    quick = tool(hang.fn, name="quick_hang", timeout_s=0.1)
    result = run(ToolSet([quick], timeout_s=30), "quick_hang", {})
    assert (result.error, result.text) == ("timeout", "error: the tool did not answer within 0.1 s")


def test_a_non_str_result_is_a_bad_result():
    result = run(ToolSet([number]), "number", {})
    assert (result.error, result.text) == ("bad_result", "error: tool 'number' returned int, not str")


@pytest.mark.parametrize(
    ("side", "expected"),
    [
        ("right", DIGITS[:40]),
        ("left", DIGITS[-40:]),
        ("middle", "01234567...[85 characters cut]...3456789"),
    ],
)
def test_long_results_are_cut_on_each_side(side, expected):
    result = run(ToolSet([long_text], max_result_chars=40, truncate_side=side), "long_text", {})
    assert (result.text, result.truncated, result.error) == (expected, True, None)
    assert len(result.text) == 40


def test_error_texts_are_cut_too():
    result = run(ToolSet([Calculator()], max_result_chars=12, truncate_side="right"), "nope", {})
    assert (result.text, result.truncated) == ("error: unkno", True)


def test_truncate_edges():
    assert truncate("short", 10, "middle") == "short"
    assert truncate(DIGITS, 10, "middle") == DIGITS[:10]  # no room for the marker: a plain cut
    assert truncate("x" * 1000, 30, "middle") == "xx...[996 characters cut]...xx"
    # 1030 - 60 leaves a 3-digit count once the marker's own length is taken into account
    text = "a" * 500 + "b" * 530
    assert truncate(text, 60, "middle") == "a" * 17 + "...[996 characters cut]..." + "b" * 17


def test_duplicate_names_and_bad_settings_are_errors():
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        ToolSet([Calculator(), Calculator()])
    with pytest.raises(ValueError, match="truncate_side must be one of left, right, middle, got 'top'"):
        ToolSet([], truncate_side="top")
    with pytest.raises(TypeError, match="a ToolSet holds Tool instances"):
        ToolSet([print])


def test_builtin_names_are_the_ones_built():
    # config validation checks names against tools/names.py; loading and interaction build from it
    assert tuple(BUILTIN_TOOLS) == BUILTIN_TOOL_NAMES
    assert tuple(BUILTIN_INTERACTIONS) == BUILTIN_INTERACTION_NAMES
