"""parse_tool_calls on the hermes format: every block becomes one ToolCall, in order, and a block
the loop cannot run keeps the reason the model will read."""

import pytest

from tandem.rollout.tool_calls import ToolCall, parse_tool_calls

UNCLOSED = "a <tool_call> block is not closed with </tool_call>"


def test_text_without_calls_is_an_answer():
    assert parse_tool_calls("The answer is 408.") == []


def test_two_calls_in_one_text_in_order():
    text = (
        "Let me compute both.\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>\n'
        "and then\n"
        '<tool_call>{"name": "python", "arguments": {"code": "print(1)", "timeout": 2}}</tool_call>'
    )
    assert parse_tool_calls(text) == [
        ToolCall("calculator", {"expression": "12*34"}),
        ToolCall("python", {"code": "print(1)", "timeout": 2}),
    ]


def test_call_without_arguments_gets_an_empty_object():
    assert parse_tool_calls('<tool_call>{"name": "now"}</tool_call>') == [ToolCall("now", {})]


def test_an_unclosed_block_after_a_closed_one_is_an_error_call():
    text = (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+'
    )
    assert parse_tool_calls(text) == [
        ToolCall("calculator", {"expression": "1+1"}),
        ToolCall("", {}, UNCLOSED),
    ]


def test_an_unclosed_block_before_a_closed_one_does_not_lose_the_good_call():
    text = '<tool_call>{"name": "a"  <tool_call>{"name": "b", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("", {}, UNCLOSED), ToolCall("b", {})]


def test_a_call_whose_arguments_hold_the_opening_tag_is_one_call():
    code = "print('<tool_call>')"
    text = '<tool_call>{"name": "python", "arguments": {"code": "' + code + '"}}</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("python", {"code": code})]


def test_an_unclosed_block_alone_is_one_error_call():
    assert parse_tool_calls('I will call <tool_call>{"name": "calculator"') == [ToolCall("", {}, UNCLOSED)]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("[1, 2]", ToolCall("", {}, "the tool call must be a JSON object, got list")),
        ('"calculator"', ToolCall("", {}, "the tool call must be a JSON object, got str")),
        (
            "{oops",
            ToolCall(
                "",
                {},
                "the tool call is not valid JSON (Expecting property name enclosed in double quotes at char 1)",
            ),
        ),
    ],
    ids=["list", "string", "broken-json"],
)
def test_a_block_that_is_not_a_json_object(body, expected):
    assert parse_tool_calls(f"<tool_call>{body}</tool_call>") == [expected]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (r'"{\"expression\": \"12*34\"}"', ToolCall("calculator", {"expression": "12*34"})),
        ('"1+2"', ToolCall("calculator", {}, '"arguments" is a string that is not valid JSON (Extra data)')),
        ('"[1]"', ToolCall("calculator", {}, '"arguments" must be a JSON object, got list')),
        ("[1]", ToolCall("calculator", {}, '"arguments" must be a JSON object, got list')),
    ],
    ids=["json-string", "string-not-json", "string-of-a-list", "list"],
)
def test_arguments_given_as_a_json_string_or_not_an_object(arguments, expected):
    text = f'<tool_call>{{"name": "calculator", "arguments": {arguments}}}</tool_call>'
    assert parse_tool_calls(text) == [expected]


@pytest.mark.parametrize(
    "payload",
    ['{"arguments": {"x": 1}}', '{"name": "", "arguments": {}}', '{"name": 3, "arguments": {}}'],
    ids=["missing", "empty", "not-a-string"],
)
def test_a_call_without_a_name_string(payload):
    assert parse_tool_calls(f"<tool_call>{payload}</tool_call>") == [
        ToolCall("", {}, 'the tool call has no "name" string')
    ]


def test_a_bad_block_does_not_hide_the_good_ones_around_it():
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        "<tool_call>[]</tool_call>"
        '<tool_call>{"name": "b", "arguments": {"k": "v"}}</tool_call>'
    )
    assert parse_tool_calls(text) == [
        ToolCall("a", {}),
        ToolCall("", {}, "the tool call must be a JSON object, got list"),
        ToolCall("b", {"k": "v"}),
    ]


def test_an_unknown_format_is_an_error_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown tool call format 'pythonic'; known: hermes"):
        parse_tool_calls("", "pythonic")


def test_as_message_entry_is_the_openai_shape():
    call = ToolCall("calculator", {"expression": "1+1"})
    assert call.as_message_entry() == {
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": "1+1"}},
    }
