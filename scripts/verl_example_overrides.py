"""Extract the override lists of verl's example scripts: run each with bash, stubs for the launchers.

    python scripts/verl_example_overrides.py VERL_CHECKOUT [GLOB ...]   (default glob: examples/sft/**/*.sh)

Each script runs under bash in an empty folder with `torchrun`, `python3`, `python` and `ray` on PATH as
stubs that write their command line to a file and exit 0, so every shell variable resolves as the script
sets it (defaults of `${VAR:-default}` included). HOME is the literal text `$HOME` (so `$HOME/data/...`
stays a placeholder for the user's files) and the script's positional arguments are `8 $HOME/sft_out`
(verl's SFT scripts take `<nproc_per_node> <save_path>`). Printed: a Python dict, script name -> (entry
point module, its overrides), ready to paste into a test data module (tests/verl/sft_scripts.py). The
lists are configuration facts; no code of verl is copied.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STUB = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""
LAUNCHERS = ("torchrun", "python3", "python", "ray")


def entry_point(argv: list[str]) -> tuple[str, list[str]] | None:
    """(module, overrides) of a recorded launcher command line, or None when it runs no verl module."""
    if "-m" not in argv:
        return None
    i = argv.index("-m")
    module, rest = argv[i + 1], argv[i + 2 :]
    if not module.startswith("verl."):
        return None
    return module, [a for a in rest if "=" in a and not a.startswith("-")]


def extract(script: Path, work: Path) -> list[tuple[str, list[str]]]:
    stubs = work / "bin"
    stubs.mkdir(exist_ok=True)
    for name in LAUNCHERS:
        (stubs / name).write_text(STUB.replace("#!/usr/bin/env python3", f"#!{sys.executable}"))
        (stubs / name).chmod(0o755)
    record = work / "record.jsonl"
    record.unlink(missing_ok=True)
    run = work / "run"
    run.mkdir(exist_ok=True)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": "$HOME", "RECORD": str(record), "PWD": "$PWD"}
    subprocess.run(
        ["bash", str(script), "8", "$HOME/sft_out"], cwd=run, env=env, capture_output=True, timeout=60
    )
    lines = record.read_text().splitlines() if record.exists() else []
    found = [entry_point(json.loads(line)) for line in lines]
    return [f for f in found if f is not None]


def main(argv: list[str]) -> int:
    root = Path(argv[0])
    globs = argv[1:] or ["examples/sft/**/*.sh"]
    out: dict[str, tuple[str, list[str]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pattern in globs:
            for script in sorted(root.glob(pattern)):
                rel = script.relative_to(root / "examples")
                name = "_".join(rel.with_suffix("").parts).replace("-", "_").replace(".", "_")
                for module, overrides in extract(script, Path(tmp)):
                    overrides = [o.replace(os.path.realpath(Path(tmp) / "run"), "$PWD") for o in overrides]
                    out[name] = (module, overrides)
    print("{")
    for name, (module, overrides) in out.items():
        print(f"    {name!r}: ({module!r}, [")
        for text in overrides:
            print(f"        {text!r},")
        print("    ]),")
    print("}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
