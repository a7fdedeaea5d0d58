"""Extract the command lines of all of verl's example scripts, and verl's configs, as test data.

    python scripts/extract_verl_examples.py VERL [OUT_DIR]   (OUT_DIR default: tests/verl/data)

VERL is a verl checkout or a bare git dir of one (its HEAD is read). Every `examples/**/*.sh` runs under
bash in the checkout's root with `torchrun`, `python3`, `python` and `ray` on PATH as stubs that append their
command line to a file and exit 0, so each shell variable resolves as the script sets it (`${VAR:-default}`
included); the variables a cluster's scheduler sets (CLUSTER) say one node of 8 GPUs. HOME is the literal text `$HOME` (a placeholder for the user's files); scripts under
examples/sft/ get verl's SFT arguments `8 $HOME/sft_out` (`<nproc_per_node> <save_path>`). A recorded
command line runs verl when it names `-m verl.trainer.<module>` or `main_ppo_split.py`.

Written to OUT_DIR:
- examples.json: the verl commit, the count of scripts per entry point, and per script its path, entry point,
  `--config-path` (relative to the checkout) / `--config-name`, `config_file` (the primary YAML Hydra composes,
  relative to the checkout: the entry point's own when the command line names none), and override list (key=value texts in order;
  the checkout's folder written `$PROJECT_DIR`); `configs`: the primary YAML files outside verl/trainer/config
  (examples' own configs), as parsed trees.
- verl_config/: verl's config folder (verl/trainer/config, every YAML with its defaults list), as OmegaConf
  reads each file (comments dropped): what `--config-path=<verl>/verl/trainer/config` names.
The lists and trees are configuration facts; no code of verl is copied.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import yaml

STUB = """#!{python}
import json, os, sys
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""
LAUNCHERS = ("torchrun", "python3", "python", "ray")
# what a cluster's scheduler sets, which scripts read for their node and GPU counts: one node of 8 GPUs
CLUSTER = {
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_NNODES": "1",
    "SLURM_GPUS_PER_NODE": "8",
    "ARNOLD_WORKER_NUM": "1",
    "ARNOLD_WORKER_GPU": "8",
}
# read by bash before the script (BASH_ENV): a missing command, `source` of a cluster's setup file, conda,
# and sleep do nothing, srun runs its command, and `date` prints DATE (names stamped with the
# time stay the same from one extraction to the next), and `set -e` / `set -u` are dropped, so a script written for a GPU cluster
# runs on to its launcher line
PRELUDE = """
command_not_found_handle() { return 0; }
source() { return 0; }
conda() { return 0; }
srun() {  # runs its command here: srun's own options dropped
    while [[ $# -gt 0 && "$1" == -* ]]; do
        case "$1" in -w|-N|-n|--nodes|--ntasks|--nodelist) shift 2 ;; *) shift ;; esac
    done
    "$@"
}
sleep() { return 0; }
date() { echo DATE; }
set() { builtin set "$@"; builtin set +eu; }
"""
HYDRA_FLAGS = {
    "--config-path": "config_path",
    "-cp": "config_path",
    "--config-name": "config_name",
    "-cn": "config_name",
}


def entry_point(argv: list[str]) -> tuple[str, list[str]] | None:
    """(module, its arguments) of a recorded launcher command line, or None when it runs no verl trainer."""
    for i, text in enumerate(argv):
        if text == "-m" and i + 1 < len(argv) and argv[i + 1].startswith("verl.trainer."):
            return argv[i + 1], argv[i + 2 :]
        if text.endswith("main_ppo_split.py"):
            return "verl.trainer.main_ppo_split", argv[i + 1 :]
    return None


# each entry point's @hydra.main config (its folder in the checkout, its name): what a command line without
# --config-path / --config-name composes; a relative --config-path is relative to that module's folder
ENTRY_CONFIGS = {
    "verl.trainer.main_ppo": ("verl/trainer/config", "ppo_trainer"),
    "verl.trainer.main_ppo_split": ("examples/split_placement/config", "ppo_trainer_split"),
    "verl.trainer.fsdp_sft_trainer": ("verl/trainer/config", "sft_trainer"),
    "verl.trainer.sft_trainer": ("verl/trainer/config", "sft_trainer_engine"),
    "verl.trainer.main_generation": ("verl/trainer/config", "generation"),
}


def config_file(entry: dict) -> str:
    """The primary YAML (relative to the checkout) that Hydra composes for an entry's command line."""
    folder, name = ENTRY_CONFIGS[entry["entry_point"]]
    given = entry["config_path"]
    if given:  # "config" (verl's own folder, relative to the module) or a folder in the checkout
        folder = given if (given != "config" and "/" in given) else str(Path(folder).parent / given)
    return f"{folder}/{(entry['config_name'] or name).removesuffix('.yaml')}.yaml"


def split_arguments(args: list[str]) -> dict:
    """Hydra's --config-path / --config-name and the key=value overrides of an entry point's arguments."""
    out: dict = {"config_path": None, "config_name": None, "overrides": []}
    i = 0
    while i < len(args):
        text = args[i]
        flag, eq, value = text.partition("=")
        if flag in HYDRA_FLAGS:
            if not eq and i + 1 < len(args):
                value, i = args[i + 1], i + 1
            out[HYDRA_FLAGS[flag]] = value
        elif "=" in text and not text.startswith("-"):
            out["overrides"].append(text)
        i += 1
    return out


def run_script(script: Path, root: Path, work: Path) -> list[list[str]]:
    """The launcher command lines `script` runs, recorded by the stubs."""
    stubs = work / "bin"
    stubs.mkdir(exist_ok=True)
    for name in LAUNCHERS:
        (stubs / name).write_text(STUB.format(python=sys.executable))
        (stubs / name).chmod(0o755)
    record = work / "record.jsonl"
    record.unlink(missing_ok=True)
    (work / "prelude.sh").write_text(PRELUDE)
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "HOME": "$HOME",
        "RECORD": str(record),
        "BASH_ENV": str(work / "prelude.sh"),
        **CLUSTER,
    }
    args = ["8", "$HOME/sft_out"] if "examples/sft/" in str(script) else []
    # a script that waits on something (a server, a loop): what it recorded so far
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(
            ["bash", str(script), *args],
            cwd=root,
            env=env,
            capture_output=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    lines = record.read_text().splitlines() if record.exists() else []
    return [json.loads(line) for line in lines]


def extract(root: Path) -> dict:
    scripts, configs = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for script in sorted((root / "examples").rglob("*.sh")):
            for argv in run_script(script, root, Path(tmp)):
                found = entry_point(argv)
                if found is None:
                    continue
                module, args = found
                entry = {
                    "script": str(script.relative_to(root)),
                    "entry_point": module,
                    **split_arguments(args),
                }
                entry["overrides"] = [o.replace(str(root), "$PROJECT_DIR") for o in entry["overrides"]]
                if entry["config_path"]:
                    entry["config_path"] = str(
                        (root / entry["config_path"]).resolve().relative_to(root.resolve())
                    )
                named = root / config_file(entry)
                entry["config_file"] = str(named.relative_to(root))
                if named.is_file() and not entry["config_file"].startswith("verl/trainer/config"):
                    configs[entry["config_file"]] = yaml.safe_load(named.read_text())
                scripts.append(entry)
                break  # a script's first verl command line (none runs two)
    counts = Counter(s["entry_point"] for s in scripts)
    return {"counts": dict(sorted(counts.items())), "scripts": scripts, "configs": configs}


def write_config_folder(root: Path, out: Path, commit: str) -> None:
    """verl's verl/trainer/config YAML tree into OUT_DIR/verl_config, file for file, as OmegaConf reads each
    (its `defaults:` lists, `${...}` interpolations and values kept; comments dropped). A user's
    `--config-path=<verl>/verl/trainer/config` is this folder."""
    from omegaconf import OmegaConf

    src, dest = root / "verl" / "trainer" / "config", out / "verl_config"
    shutil.rmtree(dest, ignore_errors=True)
    for path in sorted(src.rglob("*.yaml")):
        rel = path.relative_to(src)
        head = (
            f"# verl's verl/trainer/config/{rel} at verl {commit[:8]} (Apache-2.0), as OmegaConf reads it: keys,\n"
            "# values, defaults lists and interpolations (comments dropped). Written by scripts/extract_verl_examples.py.\n"
        )
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(head + OmegaConf.to_yaml(OmegaConf.load(path), sort_keys=False))


def checkout(verl: Path, tmp: Path) -> tuple[Path, str]:
    """(a work tree of verl's HEAD, its commit): `verl` itself, or its HEAD written out of a bare git dir."""
    git = ["git", f"--git-dir={verl / '.git' if (verl / '.git').exists() else verl}"]
    commit = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if (verl / "examples").is_dir():
        return verl, commit
    archive = subprocess.run(
        [*git, "archive", "HEAD", "examples", "verl/trainer/config"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
    return tmp, commit


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else "tests/verl/data")
    with tempfile.TemporaryDirectory() as tmp:
        root, commit = checkout(Path(argv[0]).resolve(), Path(tmp).resolve())
        data = {"verl_commit": commit, **extract(root)}
        write_config_folder(root, out, commit)
    (out / "examples.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"verl {commit[:8]}: {len(data['scripts'])} scripts", data["counts"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
