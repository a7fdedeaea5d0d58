import asyncio
import textwrap
import threading

import pytest

from tandem.tools import FunctionTool, build_toolset, load_tools, tool

TOOL_FILE = '''
import asyncio
import threading

import tandem.tools
from tandem.tools import tool


@tool
def add(a: int, b: int = 0) -> str:
    """Add two whole numbers.

    More text that is not part of the description.
    """
    return f"{a + b} in {threading.current_thread().name}"


@tandem.tools.tool(name="shout", timeout_s=2)
async def upper(text: str, times: int | None = None, scale: float = 1.0, flag: bool = False,
                items: list[str] | None = None, options: dict | None = None, anything=None) -> str:
    """Upper-case the text."""
    await asyncio.sleep(0)
    return text.upper()
'''


def write(tmp_path, text, name="my_tools.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def run(toolset, name, arguments):
    return asyncio.run(toolset.run(name, arguments))


def test_tool_functions_of_a_file_with_their_schemas(tmp_path):
    toolset = build_toolset(["calculator"], write(tmp_path, TOOL_FILE))
    assert toolset.names == ["calculator", "add", "shout"]
    add, shout = toolset.schemas()[1:]
    assert add["function"] == {
        "name": "add",
        "description": "Add two whole numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a"],
        },
    }
    assert shout["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "text": {"type": "string"},
            "times": {"type": "integer"},
            "scale": {"type": "number"},
            "flag": {"type": "boolean"},
            "items": {"type": "array"},
            "options": {"type": "object"},
            "anything": {},
        },
        "required": ["text"],
    }
    assert toolset["shout"].timeout_s == 2


def test_sync_tools_run_in_a_thread_and_async_ones_in_the_loop(tmp_path):
    toolset = build_toolset([], write(tmp_path, TOOL_FILE))
    text = run(toolset, "add", {"a": 2, "b": 3}).text
    assert text.startswith("5 in ") and text != f"5 in {threading.current_thread().name}"
    assert run(toolset, "shout", {"text": "hi"}).text == "HI"
    assert (
        run(toolset, "add", {"a": "2"}).text
        == "error: argument 'a' of tool 'add' must be integer, got string"
    )


def test_a_tools_list(tmp_path):
    path = write(
        tmp_path,
        """
        from tandem.tools import Calculator, Tool


        class Ping(Tool):
            name = "ping"
            description = "Answers pong."
            parameters = {"type": "object", "properties": {}}

            async def call(self):
                return "pong"


        TOOLS = [Ping()]
        """,
    )
    (ping,) = load_tools(path)
    assert ping.name == "ping" and run(build_toolset(None, path), "ping", {}).text == "pong"


def test_a_decorated_function_still_works_as_a_function():
    @tool(description="Doubles.")
    def double(x: int) -> str:
        return str(2 * x)

    assert isinstance(double, FunctionTool) and double(4) == "8"


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("x = 1\n", ValueError, "defines no tools: decorate functions with @tandem.tools.tool"),
        ("TOOLS = [print]\n", TypeError, "TOOLS must be a list of tandem.tools.Tool instances"),
        ("TOOLS = 'add'\n", TypeError, "but holds str"),
        (
            "from tandem.tools import tool\n@tool\ndef calculator(expression: str) -> str:\n    'Mine.'\n    return ''\n",
            ValueError,
            "tool 'calculator' has the name of a built-in tool; rename it",
        ),
        (
            "import nonexistent_module_xyz\n",
            ImportError,
            "ModuleNotFoundError: No module named 'nonexistent_module_xyz' (line 1)",
        ),
        (
            "from tandem.tools import tool\n@tool\ndef f(x: int) -> str:\n    return ''\n",
            ImportError,
            "ValueError: tool 'f' has no description: give the function a docstring or pass description=",
        ),
        (
            "from tandem.tools import tool\n@tool\ndef f(x: set) -> str:\n    'Doc.'\n    return ''\n",
            ImportError,
            "TypeError: tool 'f': parameter 'x' is annotated <class 'set'>",
        ),
    ],
)
def test_file_errors_name_the_file_and_the_fix(tmp_path, text, error, message):
    path = write(tmp_path, text, f"tools_{abs(hash(text))}.py")
    with pytest.raises(error) as info:
        build_toolset([], path)
    assert message in str(info.value)
    assert str(path) in str(info.value) and "rollout.multi_turn.tool_file" in str(info.value)


def test_a_missing_file_and_an_unknown_builtin(tmp_path):
    with pytest.raises(
        FileNotFoundError, match="rollout.multi_turn.tool_file '.*nope.py': the file does not exist"
    ):
        build_toolset([], tmp_path / "nope.py")
    with pytest.raises(
        ValueError, match=r"'search' is not a built-in tool \(calculator, python\); fix rollout"
    ):
        build_toolset(["search"])
