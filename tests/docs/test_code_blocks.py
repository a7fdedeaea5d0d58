"""Every Python and shell block in docs/ and README.md runs as written, or says why it does not.

A block that cannot run here (a training run, a GPU install, a command that needs a model folder) carries
the line `<!-- not run: the reason -->` directly above its fence; every other block runs: the Python
blocks in one subprocess, each in a fresh namespace (so a block may not lean on another), and the shell
blocks with bash. A console block (untagged, its commands after `$ `) runs its commands and must print
the lines shown under them. Every Python block that parses, run or not, is read by ruff's undefined-name
rules (a name inside a function fails only when it is called). The commands of every block, run or not, that start a `tandem` run
(`train`, `sft`, `eval`, `config`) are read by the config loader: the keys they set must exist.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tandem.cli import is_verl_sft_override
from tandem.config import ConfigError, load_config
from tandem.config.verl.sft_trainers import verl_sft_preset

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^(?P=indent)```", re.M | re.S)
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>.*?) -->\s*$")
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}


@dataclass
class Block:
    page: str
    line: int
    kind: str  # python, shell or console
    code: str
    not_run: str | None  # the reason, when the block is marked

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks() -> list[Block]:
    """The Python and shell blocks of every page, with the reason a block is not run (its marker)."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            lang, code = match["lang"].lower(), match["code"]
            if lang in PYTHON:
                kind = "python"
            elif lang in SHELL:
                kind = "shell"
            elif not lang and code.startswith("$ "):
                kind = "console"
            else:
                continue  # output, diagrams, YAML, JSON
            before = [line for line in text[: match.start()].splitlines() if line.strip()]
            marker = NOT_RUN.search(before[-1]) if before else None
            indent = len(match["indent"])
            code = "\n".join(line[indent:] for line in code.splitlines())
            line = text[: match.start()].count("\n") + 1
            name = page.relative_to(ROOT).as_posix()
            found.append(Block(name, line, kind, code, marker["reason"].strip() if marker else None))
    return found


BLOCKS = blocks()


def test_every_marked_block_says_why():
    assert BLOCKS and all(block.not_run != "" for block in BLOCKS), [
        str(b) for b in BLOCKS if b.not_run == ""
    ]
    kinds = {block.kind for block in BLOCKS if block.not_run is None}
    assert kinds == {"python", "shell", "console"}  # each runner below has blocks to run


RUN_PYTHON = """
import json, sys, traceback
failures = {}
for name, code in json.loads(sys.stdin.read()):
    try:
        exec(compile(code, name, "exec"), {"__name__": "__doc_block__"})
    except BaseException:
        failures[name] = traceback.format_exc(limit=3)
print(json.dumps(failures))
"""


def test_python_blocks_run(tmp_path):
    runnable = [(str(b), b.code) for b in BLOCKS if b.kind == "python" and b.not_run is None]
    done = subprocess.run(
        [sys.executable, "-c", RUN_PYTHON],
        input=json.dumps(runnable),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == 0, done.stderr
    failures = json.loads(done.stdout.splitlines()[-1])
    assert not failures, "\n".join(f"{name}:\n{error}" for name, error in failures.items())


def _is_python(block: Block) -> bool:
    try:
        ast.parse(block.code)
    except SyntaxError:
        return False
    return True


def test_python_blocks_use_no_undefined_name(tmp_path):
    """A name used inside a function fails only when the function runs (agentic.md's tool once read a
    DICTIONARY it never defined): ruff's undefined-name rules read every block, marked or not, as a file.
    A marked block that is not Python as written (DESIGN.md's signatures-only sketch) is left out; an
    unmarked one must parse (test_python_blocks_run)."""
    for block in (b for b in BLOCKS if b.kind == "python"):
        if block.not_run is None or _is_python(block):  # the file's name says the page and line
            name = str(block).replace("/", "_").replace(".md:", "_md_line")
            (tmp_path / f"{name}.py").write_text(block.code + "\n")
    ruff = Path(sys.executable).parent / "ruff"
    rules = ["--select", "F821,F822", "--output-format", "concise"]
    done = subprocess.run(
        [str(ruff), "check", "--no-cache", "--isolated", *rules, "."],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _start(command: str, cwd: Path, options: str = "") -> subprocess.Popen:
    """A shell command started in `cwd`, in the shell of someone who followed the README (`tandem` and
    .venv/bin first on the PATH)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    argv = ["bash", *options.split(), "-c", command]
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_shell_and_console_blocks_run(tmp_path):
    """Each shell block runs with `bash -euo pipefail` and must succeed. Each `$ command` of a console block
    runs and must print the lines shown under it (its exit status is part of the example: an error example
    exits non-zero). All start at once: each `tandem` command spends most of its time importing."""
    started = []
    for n, block in enumerate(b for b in BLOCKS if b.not_run is None and b.kind in ("shell", "console")):
        if block.kind == "shell":
            steps = [(block.code, [])]
        else:
            steps = [
                (s.splitlines()[0], s.splitlines()[1:]) for s in re.split(r"^\$ ", block.code, flags=re.M)[1:]
            ]
        for m, (command, shown) in enumerate(steps):
            cwd = tmp_path / f"{n}_{m}"
            cwd.mkdir()
            options = "-euo pipefail" if block.kind == "shell" else ""
            started.append((block, command, shown, _start(command, cwd, options)))
    failures = []
    for block, command, shown, process in started:
        printed, _ = process.communicate(timeout=300)
        if not shown and process.returncode != 0:
            failures.append(f"{block}: exit status {process.returncode}:\n{printed}")
        missing = [line.strip() for line in shown if line.strip() and line.strip() not in printed]
        if missing:
            failures.append(f"{block}: `{command}` did not print {missing}; it printed:\n{printed}")
    assert not failures, "\n\n".join(failures)


def _tandem_commands(code: str) -> list[list[str]]:
    """The `tandem train|sft|eval|config` command lines of a shell block, as argument lists."""
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line.removeprefix("$ "), comments=True)
        if (
            len(words) >= 2
            and Path(words[0]).name == "tandem"
            and words[1] in ("train", "sft", "eval", "config")
        ):
            commands.append(words[1:])
    return commands


DEFAULT_PRESET = {"train": "grpo", "sft": "sft", "eval": "grpo", "config": "grpo"}
# what a documented command names but this checkout lacks: model folders, data files, reward and tool files
ABSENT_FILE = re.compile(r"does not exist|not found|no such file|point actor\.model_path", re.I)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind != "python"], ids=str)
def test_documented_tandem_commands_name_real_keys(block):
    for command, *args in _tandem_commands(block.code):
        preset = DEFAULT_PRESET[command]
        if args and "=" not in args[0] and args[0] != "...":
            preset, *args = args
        overrides = [arg for arg in args if "=" in arg and not arg.startswith("--")]
        sft = command == "sft"
        # verl's SFT keys: the preset of their trainer, as the CLI picks it
        if sft and preset == "sft" and any(is_verl_sft_override(o) for o in overrides):
            preset = verl_sft_preset(o.partition("=")[0] for o in overrides)
        try:
            load_config(str(ROOT / preset) if preset.endswith(".yaml") else preset, overrides, sft=sft)
        except ConfigError as error:
            real = [problem for problem in error.problems if not ABSENT_FILE.search(problem)]
            if block.kind == "console" and "unknown key" in str(error):
                continue  # the example shows the error a misspelt key gives
            assert not real, f"{block}: tandem {command} {preset} {' '.join(overrides)}:\n" + "\n".join(real)
