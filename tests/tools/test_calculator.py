import asyncio

import pytest

from tandem.tools import build_toolset, evaluate
from tandem.tools.calculator import format_number


def calc(expression):
    return asyncio.run(build_toolset(["calculator"]).run("calculator", {"expression": expression}))


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("910*391", "355810"),
        ("2+3*4", "14"),
        ("(2+3)*4", "20"),
        ("2**10", "1024"),
        ("2**-1", "0.5"),
        ("6/3", "2"),
        ("1/3", "0.333333333333"),
        ("-5+2", "-3"),
        ("-(2+3)", "-5"),
        ("+4", "4"),
        ("7//2", "3"),
        ("7%3", "1"),
        ("0.1+0.2", "0.3"),
        ("2**0.5", "1.41421356237"),
        (" 1.5*4 ", "6"),
        ("10**99", "1" + "0" * 99),
    ],
)
def test_calculator_values(expression, expected):
    result = calc(expression)
    assert (result.text, result.error) == (expected, None)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os')", "function calls not allowed"),
        ("x+1", "names not allowed"),
        ("(1).real", "attribute access not allowed"),
        ("'a'*3", "'a' is not a number"),
        ("True+1", "True is not a number"),
        ("1j*2", "1j is not a number"),
        ("1 < 2", "comparisons not allowed"),
        ("9**9**9", "the exponent 387420489 is too large; at most 100"),
        ("99**60", "the result would have more than 100 digits"),
        ("(10**60)*(10**60)", "the result has more than 100 digits"),
        ("10**100", "the result has more than 100 digits"),
        ("1e308*10", "the result is too large"),
        ("(-8)**0.5", "not a real number"),
        ("1+" * 100 + "1", "at most 200"),
        ("1/0", "division by zero"),
        ("1//0.0", "division by zero"),
        ("5%0", "division by zero"),
        ("0**-1", "division by zero"),
        ("2*", "not a valid expression"),
    ],
)
def test_calculator_refusals_are_error_results(expression, message):
    result = calc(expression)
    assert result.error == "raised"
    assert result.text.startswith("error: ValueError: ") and message in result.text


def test_evaluate_keeps_ints_exact_and_formats_floats():
    assert evaluate("3*(4+5)") == 27 and isinstance(evaluate("3*(4+5)"), int)
    assert evaluate("1/4") == 0.25
    assert [format_number(v) for v in (2.0, -0.0, 1e20, 1 / 7)] == ["2", "0", "1e+20", "0.142857142857"]
