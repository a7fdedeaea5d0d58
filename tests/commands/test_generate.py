"""`tandem generate` end to end on the tiny model with Hugging Face generate (fp32, CPU): the output,
resume after an interruption (the same file as an uninterrupted run), and bad input."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tandem.cli import main
from tandem.commands.generate import parts_folder, run_generation
from tandem.config import ConfigError
from tandem.config.generate import load_generate_config
from tandem.data import DataError
from tandem.data.synthetic import write_rows
from tandem.models.tiny import save_tiny
from tandem.rollout import build_rollout

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}


def rows(n: int) -> list[dict]:
    return [
        {
            "data_source": "arith",
            "prompt": [{"role": "user", "content": f"{i}+{i}="}],
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate")
    return save_tiny(root / "model", **TINY), write_rows(rows(5), root / "in.parquet")


def config(assets, out, *extra):
    model, data = assets
    keys = [f"model_path={model}", f"data_path={data}", f"output_path={out}", "engine=hf", "n=2"]
    keys += ["batch_size=2", "max_response_length=6", "seed=3", "progress_bar=false", *extra]
    return load_generate_config(None, keys)[0]


class Interrupted(Exception):
    pass


def interrupting(after_calls: int, calls: list):
    """build_rollout, with an engine whose generate raises after `after_calls` calls (a killed run)."""

    def build(spec):
        engine = build_rollout(spec)
        generate = engine.generate

        def counted(prompts, sampling):
            if len(calls) == after_calls:
                raise Interrupted
            calls.append(len(prompts))
            return generate(prompts, sampling)

        engine.generate = counted
        return engine

    return build


def test_resume_after_an_interruption_writes_what_an_uninterrupted_run_writes(assets, tmp_path):
    whole = run_generation(config(assets, tmp_path / "whole.parquet"))
    out = tmp_path / "resumed.parquet"
    calls: list[int] = []
    with pytest.raises(Interrupted):
        run_generation(config(assets, out), build_engine=interrupting(1, calls))
    assert calls == [2] and not out.exists()
    assert sorted(p.name for p in parts_folder(out).iterdir()) == ["batch_000000.parquet", "generate.json"]
    calls.clear()
    run_generation(config(assets, out), build_engine=interrupting(99, calls))
    assert calls == [2, 1]  # batches 1 and 2 only
    assert pq.read_table(out).equals(pq.read_table(whole))
    assert not parts_folder(out).exists()
    table = pq.read_table(whole).to_pylist()
    assert [len(r["responses"]) for r in table] == [2] * 5
    assert all(1 <= n <= 6 for r in table for n in r["response_lengths"])


def test_resume_with_other_settings_is_refused(assets, tmp_path):
    out = tmp_path / "out.parquet"
    with pytest.raises(Interrupted):
        run_generation(config(assets, out), build_engine=interrupting(1, []))
    with pytest.raises(ConfigError, match=r"other settings \(seed: 3 then, 4 now\)"):
        run_generation(config(assets, out, "seed=4"))
    run_generation(config(assets, out, "seed=4", "overwrite=true"))  # starts over
    assert pq.read_table(out).num_rows == 5


def test_an_existing_output_is_kept_unless_overwrite(assets, tmp_path, capsys):
    model, data = assets
    out = tmp_path / "out.parquet"
    out.write_text("earlier")
    args = ["generate", f"model_path={model}", f"data_path={data}", f"output_path={out}", "engine=hf"]
    args += ["max_response_length=2"]
    assert main(args) == 2
    assert "output_path=" in capsys.readouterr().err and out.read_text() == "earlier"
    assert main([*args, "--overwrite"]) == 0
    assert pq.read_table(out).num_rows == 5


def test_bad_input_names_the_file_row_and_key(assets, tmp_path):
    model, _ = assets
    no_prompt = tmp_path / "no_prompt.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "1+1"}]), no_prompt)
    with pytest.raises(
        DataError, match=r"no_prompt.parquet row 0: missing field 'prompt' \(fields present: question\)"
    ):
        run_generation(config((model, no_prompt), tmp_path / "a.parquet"))
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.list_(pa.struct([("role", pa.string())])))}), empty)
    with pytest.raises(DataError, match="empty.parquet: the file holds no rows"):
        run_generation(config((model, empty), tmp_path / "b.parquet"))
    with pytest.raises(DataError, match=r"row 0: prompt is \d+ tokens, longer than max_prompt_length=4"):
        run_generation(config(assets, tmp_path / "c.parquet", "max_prompt_length=4"))


def test_an_output_that_cannot_be_written_is_named_before_the_model_loads(assets, tmp_path, capsys):
    model, data = assets
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    args = ["generate", f"model_path={model}", f"data_path={data}", "engine=hf", "max_response_length=2"]
    assert main([*args, f"output_path={blocker}/sub/out.parquet"]) == 2
    err = capsys.readouterr().err
    assert f"output_path={blocker}/sub/out.parquet: {blocker} is a file, not a folder" in err
    assert ".parts" not in err and "Traceback" not in err
    # a read-only place (/proc refuses new files, to root as well): named, exit 2, nothing else said
    assert main([*args, "output_path=/proc/tandem_out.parquet"]) == 2
    err = capsys.readouterr().err
    assert "output_path=/proc/tandem_out.parquet: cannot write in /proc (" in err and "model " not in err


def test_ctrl_c_exits_130_and_the_next_run_resumes(assets, tmp_path, capsys, monkeypatch):
    """SIGINT arrives as KeyboardInterrupt in the main thread: here after the first part is written."""
    import tandem.commands.generate as generate

    whole = run_generation(config(assets, tmp_path / "whole.parquet"))
    model, data = assets
    out = tmp_path / "out.parquet"
    args = ["generate", f"model_path={model}", f"data_path={data}", f"output_path={out}", "engine=hf", "n=2"]
    args += ["batch_size=2", "max_response_length=6", "seed=3", "progress_bar=false"]
    write_part = generate._write_part

    def interrupted_after_one(parts, batch, rows, columns):
        write_part(parts, batch, rows, columns)
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "_write_part", interrupted_after_one)
    assert main(args) == 130
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith("tandem generate: 5 prompts x n=2 = 10 samples")  # said at once
    assert f"model {model}, engine hf on cpu" in err and err.rstrip().endswith("tandem generate: interrupted")
    assert not out.exists() and (parts_folder(out) / "batch_000000.parquet").is_file()
    monkeypatch.setattr(generate, "_write_part", write_part)
    assert main(args) == 0
    assert "resumes " in capsys.readouterr().err
    assert pq.read_table(out).equals(pq.read_table(whole))
