import asyncio

import pytest

from tandem.tools import Interaction, InteractionReply, TryAgain, build_interaction

RETRY = InteractionReply("That is not right. Try again.", False)
DONE = InteractionReply(None, True)


def respond(answer, ground_truth, data_source="tool_multiply", interaction=None):
    messages = [{"role": "user", "content": "12*34"}, {"role": "assistant", "content": answer}]
    sample = {"ground_truth": ground_truth, "data_source": data_source, "extra_info": None}
    return asyncio.run((interaction or TryAgain()).respond(messages, sample))


def test_try_again_ends_on_a_right_answer_by_the_data_sources_scorer():
    assert respond("12*34 = 408", "408") == DONE
    assert respond("The answer is 1,408.", 1408) == DONE


def test_try_again_asks_again_without_revealing_the_answer():
    reply = respond("I think it is 407", "408")
    assert reply == RETRY and "408" not in reply.text
    # the tool_multiply scorer reads no answer inside a tool call
    assert (
        respond('<tool_call>{"name":"calculator","arguments":{"expression":"408"}}</tool_call>', "408")
        == RETRY
    )


def test_try_again_without_a_scorer_compares_the_last_whole_number():
    assert respond("so 42", "42", data_source="my_puzzles") == DONE
    assert respond("42 or 43", "42", data_source="my_puzzles") == RETRY
    assert respond(" paris ", "paris", data_source="my_puzzles") == DONE  # not a number: the text


def test_try_again_ends_when_there_is_no_ground_truth_to_judge_by():
    assert respond("anything", None) == DONE


def test_build_interaction_built_in_and_none():
    assert build_interaction(None, None) is None
    assert isinstance(build_interaction("try_again"), TryAgain)
    with pytest.raises(ValueError, match=r"interaction 'ask' is not built in \(try_again\); define it"):
        build_interaction("ask")


FILE = """
from tandem.tools import Interaction, InteractionReply


class Polite(Interaction):
    name = "polite"

    async def respond(self, messages, sample):
        return InteractionReply("Please check your work.", False)


INTERACTION = {value}
"""


@pytest.mark.parametrize("value", ["Polite()", "Polite"])
def test_an_interaction_from_a_file(tmp_path, value):
    path = tmp_path / f"interaction_{value.strip('()')}_{len(value)}.py"
    path.write_text(FILE.format(value=value))
    for name in (None, "polite"):
        interaction = build_interaction(name, path)
        assert isinstance(interaction, Interaction) and interaction.name == "polite"
    assert respond("1", "2", interaction=interaction) == InteractionReply("Please check your work.", False)


@pytest.mark.parametrize(
    ("text", "name", "error", "message"),
    [
        (
            FILE.format(value="Polite()"),
            "try_again",
            ValueError,
            "defines interaction 'polite', but rollout.multi_turn.interaction is 'try_again'",
        ),
        ("x = 1\n", None, AttributeError, "has no INTERACTION: define INTERACTION = MyInteraction()"),
        ("INTERACTION = 'polite'\n", None, TypeError, "INTERACTION must be a tandem.tools.Interaction"),
    ],
)
def test_interaction_file_errors(tmp_path, text, name, error, message):
    path = tmp_path / "interaction.py"
    path.write_text(text)
    with pytest.raises(error) as info:
        build_interaction(name, path)
    assert message in str(info.value) and f"rollout.multi_turn.interaction_file '{path}'" in str(info.value)


def test_a_missing_interaction_file(tmp_path):
    with pytest.raises(
        FileNotFoundError, match="rollout.multi_turn.interaction_file '.*gone.py': the file does not exist"
    ):
        build_interaction("polite", tmp_path / "gone.py")
