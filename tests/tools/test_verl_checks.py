"""Start-up checks of verl-style multi-turn runs: every fault of a tool or interaction file is a
ConfigError naming the file (and the line, where there is one) before any worker starts; verl's
interaction YAML loads with its interaction_kwargs reaching the interaction; row fields that Tandem
reads nowhere, or that this config would not use, are warned about by name."""

import asyncio
import logging

import pytest
from verl_rows import DATA_SOURCE, INTERACTION_YAML, TOOL_YAML, gsm8k_rows, write_parquet

from tandem.config import ConfigError, load_config
from tandem.data import DataError, PromptDataset
from tandem.models.tiny import build_tokenizer
from tandem.rollout.agent import interaction_from_config, toolset_from_config
from tandem.tools import InteractionRouter
from tandem.tools.gsm8k import INCORRECT_REPLY, Gsm8kInteraction
from tandem.trainer.start_checks.multi_turn import check_multi_turn


def multi_turn(*overrides):
    return load_config("grpo", ["rollout.mode=async", *overrides])


def tool_file_error(path) -> str:
    with pytest.raises(ConfigError) as info:
        toolset_from_config(multi_turn(f"rollout.multi_turn.tool_file={path}").rollout.multi_turn)
    message = str(info.value)
    assert f"rollout.multi_turn.tool_file '{path}'" in message
    return message


ENTRY = "tools:\n  - class_name: {cls}\n    config: {{type: native}}\n    tool_schema:\n      type: function\n      function: {{name: {name}, description: d, parameters: {{type: object, properties: {{}}}}}}\n"


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("syntax.py", "def f(:\n", "SyntaxError: invalid syntax at line 1"),
        ("empty.py", "x = 1\n", "defines no tools: decorate functions with @tandem.tools.tool"),
        ("not_tools.yaml", "foo: 1\n", "not verl's tool config: expected a top-level 'tools:' list"),
        (
            "no_tools.yaml",
            "tools: []\n",
            "'tools:' lists nothing; add an entry or leave rollout.multi_turn.tool_file",
        ),
        (
            "swapped.yaml",
            INTERACTION_YAML.read_text(),
            "it holds 'interaction': it belongs in rollout.multi_turn.interaction_file",
        ),
        ("bad.yaml", "tools:\n  - class_name: a\n   config: x\n", "not valid YAML at line 3"),
        (
            "missing_class.yaml",
            "tools:\n  - config: {type: native}\n",
            "tools[0] (line 2): each entry needs class_name",
        ),
        (
            "builtin.yaml",
            ENTRY.format(cls="verl.tools.gsm8k_tool.Gsm8kTool", name="calculator"),
            "tool 'calculator' has the name of a built-in tool; rename it",
        ),
        (
            "no_module.yaml",
            ENTRY.format(cls="no_such_pkg_xyz.tools.Tool", name="t"),
            "tools[0] (line 2): cannot import module 'no_such_pkg_xyz.tools' of class_name no_such_pkg_xyz.tools.Tool "
            "(ModuleNotFoundError: No module named 'no_such_pkg_xyz'); put its package on the Python path",
        ),
        (
            "sandbox.yaml",
            ENTRY.format(cls="verl.tools.sandbox_fusion_tools.SandboxFusionTool", name="code"),
            "verl.tools.sandbox_fusion_tools.SandboxFusionTool is verl's own class, and Tandem has no port of it",
        ),
        (
            "no_class.yaml",
            ENTRY.format(cls="json.NoSuchClass", name="t"),
            "module 'json' has no class 'NoSuchClass'",
        ),
        (
            "mcp.yaml",
            "tools:\n  - class_name: a.B\n    config: {type: mcp}\n",
            "config.type='mcp': Tandem builds native tools only",
        ),
        ("tools.txt", "tools: []\n", "neither a Python file (.py) nor verl's YAML config (.yaml, .yml)"),
    ],
)
def test_each_fault_of_a_tool_file_is_a_config_error_naming_the_file(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    assert expected in tool_file_error(path)


def test_a_missing_tool_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout.multi_turn.tool_file: '.*gone.yaml' does not exist"):
        multi_turn(f"rollout.multi_turn.tool_file={tmp_path / 'gone.yaml'}")  # the config's own check


def test_an_interaction_file_fault_is_a_config_error(tmp_path):
    path = tmp_path / "interaction.yaml"
    path.write_text(
        "interaction:\n  - name: a\n    class_name: verl.interactions.weather_interaction.WeatherInteraction\n"
    )
    with pytest.raises(
        ConfigError, match=r"interaction\[0\] \(line 2\): verl.interactions.weather_interaction"
    ):
        interaction_from_config(multi_turn(f"rollout.multi_turn.interaction_file={path}").rollout.multi_turn)


def test_verls_interaction_yaml_gets_the_rows_interaction_kwargs():
    m = multi_turn(f"rollout.multi_turn.interaction_file={INTERACTION_YAML}").rollout.multi_turn
    router = interaction_from_config(m)
    assert isinstance(router, InteractionRouter) and router.name == "gsm8k"
    gsm8k = router.interactions["gsm8k"]
    assert isinstance(gsm8k, Gsm8kInteraction) and gsm8k.config == {"name": "gsm8k"}

    async def conversation():
        kwargs = {"name": "gsm8k", "query": "3+4", "ground_truth": "7"}
        sample = {"instance_id": "t1", "interaction_kwargs": kwargs}
        await router.start("t1", **kwargs)
        state = dict(gsm8k.instances)
        replies = [
            await router.respond([{"role": "assistant", "content": text}], sample)
            for text in ("It is 7", "#### 8", "so #### 7")  # strict: only a number after #### counts
        ]
        await router.finish("t1")
        return state, replies

    state, replies = asyncio.run(conversation())
    assert state == {"t1": "7"}  # the row's ground truth reached start()
    assert [(r.text, r.done, r.score) for r in replies] == [
        (INCORRECT_REPLY, False, 0.0),
        (INCORRECT_REPLY, False, 0.0),
        (None, True, 1.0),
    ]
    assert gsm8k.instances == {}  # finish() dropped the state


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def dataset(tmp_path, tokenizer, rows):
    return PromptDataset(write_parquet(tmp_path / "rows.parquet", rows), tokenizer, max_prompt_length=64)


def test_fields_tandem_reads_nowhere_are_warned_about_by_name_and_verls_fields_are_not(
    tmp_path, tokenizer, caplog
):
    rows = gsm8k_rows(4)
    rows[2]["difficulty"] = "easy"
    rows[0]["difficulty"] = None  # parquet's columns come from the first row; null counts as absent
    with caplog.at_level(logging.WARNING, logger="tandem.data.prompts"):
        data = dataset(tmp_path, tokenizer, rows)
    assert data.unread_fields == {
        "ability": (4, f"{tmp_path / 'rows.parquet'} row 0"),
        "difficulty": (1, f"{tmp_path / 'rows.parquet'} row 2"),
    }
    (record,) = [r for r in caplog.records if "reads nowhere" in r.getMessage()]
    message = record.getMessage()
    assert "'ability' (4 rows" in message and "'difficulty' (1 rows" in message
    for verl_field in (
        "tools_kwargs",
        "interaction_kwargs",
        "agent_name",
        "need_tools_kwargs",
        "index",
        "split",
    ):
        assert verl_field not in message
    assert [data[i]["agent_name"] for i in range(4)] == ["tool_agent"] * 4


def test_an_agent_name_tandem_does_not_run_is_a_data_error(tmp_path, tokenizer):
    rows = gsm8k_rows(2)
    rows[1]["agent_name"] = "react_agent"
    with pytest.raises(
        DataError, match=r"row 1: field 'agent_name' is 'react_agent'; Tandem runs verl's tool_agent"
    ):
        dataset(tmp_path, tokenizer, rows)


def test_verl_fields_this_config_would_not_use_are_warned_about(tmp_path, tokenizer, caplog):
    data = dataset(tmp_path, tokenizer, gsm8k_rows(3))
    sync = load_config("grpo", ["rollout.mode=sync"])
    with caplog.at_level(logging.WARNING, logger="tandem.trainer.start_checks.multi_turn"):
        check_multi_turn(sync, [data])
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        m.startswith("extra_info.tools_kwargs: no tool reads them") and "(3 rows" in m for m in messages
    )
    assert any(m.startswith("extra_info.interaction_kwargs: no interaction reads them") for m in messages)
    assert any(m.startswith("agent_name=tool_agent: rollout.mode=sync generates one turn") for m in messages)

    caplog.clear()
    agent = multi_turn(
        f"rollout.multi_turn.tool_file={TOOL_YAML}",
        f"rollout.multi_turn.interaction_file={INTERACTION_YAML}",
    )
    with caplog.at_level(logging.WARNING, logger="tandem.trainer.start_checks.multi_turn"):
        check_multi_turn(agent, [data])
    assert caplog.records == []  # every verl field has a reader


def test_a_row_naming_an_interaction_the_file_lacks_is_a_data_error(tmp_path, tokenizer):
    rows = gsm8k_rows(2)
    rows[0]["extra_info"]["interaction_kwargs"]["name"] = "weather"
    data = dataset(tmp_path, tokenizer, rows)
    cfg = multi_turn(f"rollout.multi_turn.interaction_file={INTERACTION_YAML}")
    with pytest.raises(
        DataError, match=r"row 0: interaction_kwargs name the interaction 'weather'.*\(gsm8k\)"
    ):
        check_multi_turn(cfg, [data])
    assert data[1]["data_source"] == DATA_SOURCE


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            ENTRY.format(cls="no_such_pkg_xyz.tools.Tool", name="t"),
            "cannot import module 'no_such_pkg_xyz.tools'",
        ),
        ("def f(:\n", "SyntaxError: invalid syntax at line 1"),
    ],
)
def test_tandem_train_with_a_bad_tool_file_exits_2_before_any_worker_starts(tmp_path, capsys, text, expected):
    from tandem.cli import main
    from tandem.models.tiny import save_tiny

    model = save_tiny(tmp_path / "model", hidden_size=32, intermediate_size=64, num_layers=1)
    train = write_parquet(tmp_path / "train.parquet", gsm8k_rows(4))
    tool_file = tmp_path / ("tools.yaml" if text.startswith("tools:") else "tools.py")
    tool_file.write_text(text)
    overrides = [
        f"actor.model_path={model}",
        f"data.train_files=[{train}]",
        "rollout.mode=async",
        f"rollout.multi_turn.tool_file={tool_file}",
        f"trainer.output_dir={tmp_path / 'out'}",
    ]
    capsys.readouterr()  # what building the model printed
    assert main(["train", "grpo", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tandem train: config error\n") and expected in err and str(tool_file) in err
    assert "frozen importlib" not in err
