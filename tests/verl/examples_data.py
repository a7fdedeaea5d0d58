"""verl's example scripts as data: tests/verl/data/examples.json (the command lines of all of verl's examples/ at
b178a3cd, written by scripts/extract_verl_examples.py, each script run by bash with stubbed launchers so its shell
variables take their defaults). The modules beside this one (e2e_scripts, sft_scripts, megatron_scripts,
generation_scripts) name the scripts their tests read; none holds a second copy of a command line.
"""

import json
import re
from pathlib import Path

EXAMPLES: list[dict] = json.loads((Path(__file__).parent / "data" / "examples.json").read_text())["scripts"]


def example_overrides(script: str) -> list[str]:
    """The override list verl's example `script` (a path under verl's repository) passes to its entry point."""
    (found,) = [entry["overrides"] for entry in EXAMPLES if entry["script"] == script]
    return list(found)


def script_key(script: str) -> str:
    """A script's name in the tests: its path under examples/ in lower case, each run of other characters an
    underscore (`examples/grpo_trainer/run_qwen2-7b_sgl_megatron.sh` is `grpo_trainer_run_qwen2_7b_sgl_megatron`)."""
    return re.sub(r"[^a-z0-9]+", "_", script.removeprefix("examples/").removesuffix(".sh").lower())


def with_values(script: list[str], changes: dict[str, object]) -> list[str]:
    """A script's overrides with the value of each key in `changes` replaced (a `+` prefix dropped there); every
    other override as the script gives it."""
    out = []
    for text in script:
        key = text.partition("=")[0].lstrip("+")
        out.append(f"{key}={changes[key]}" if key in changes else text)
    return out
