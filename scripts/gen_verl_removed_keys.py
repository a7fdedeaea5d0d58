"""Writes src/tandem/config/verl/removed_keys.py: the keys verl's configs had in its releases of the last year and
the config Tandem tracks (tests/verl/data/verl_config, verl/trainer/config at b178a3cd) lacks, with their defaults
in those releases, the last release that had each, and verl's current key for it where one is known.

    python scripts/gen_verl_removed_keys.py                      # the table, from the release data below
    python scripts/gen_verl_removed_keys.py --verl-git DIR       # first re-read the releases from verl's git

The releases' keys and defaults (Hydra's composition of each release's trainer, SFT and generation configs; names
and values only) are kept as test data, tests/verl/data/verl_release_keys.json, so the table regenerates without a
verl checkout; `--verl-git` rewrites that file from the release tags of a verl git folder (bare or not).
Which releases: every release tag dated within a year of AS_OF, or the last three releases when fewer than three
are; AS_OF is fixed here so that the output depends on the inputs alone (move it when the table is remade).

verl's current key for a removed one: where verl said so (RENAMES below: a commit message's migration notes or
its docs), else the one current key of the same section whose last name is the removed key's last name (the
key moved, e.g. rollout.update_weights_bucket_megabytes -> rollout.checkpoint_engine.update_weights_bucket_megabytes);
otherwise None (verl dropped the setting). tests/verl/test_verl_removed_keys.py fails when the table is stale.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tarfile
import tempfile
from datetime import date, datetime
from io import BytesIO
from pathlib import Path
from typing import Any

from tandem.config.yaml_io import dotted_leaves

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src/tandem/config/verl/removed_keys.py"
VERL_CONFIG = ROOT / "tests/verl/data/verl_config"  # the current config (b178a3cd)
RELEASE_DATA = ROOT / "tests/verl/data/verl_release_keys.json"
AS_OF = date(2026, 12, 6)
# the table each command line's keys are read by: (name, verl's configs it unites), as in gen_verl_defaults.py
TABLES = (
    ("REMOVED_PPO", "ppo", ("ppo_trainer", "ppo_megatron_trainer")),
    ("REMOVED_SFT", "sft", ("sft_trainer", "sft_trainer_engine")),
    ("REMOVED_GENERATION", "generation", ("generation",)),
)
# (table, removed key) -> (the key verl has for it after, the same values?, where verl says so). A target that is
# itself removed is followed to the key verl has now.
RENAMES: dict[tuple[str, str], tuple[str, bool, str]] = {
    ("sft", "optim.warmup_steps_ratio"): (
        "optim.lr_warmup_steps_ratio",
        True,
        "verl 6cf90ceb0 (#3656), commit message: fsdp_sft_trainer's optim aligned with the FSDP optim",
    ),
    ("ppo", "algorithm.rollout_is_level"): (
        "algorithm.rollout_correction.rollout_is",
        True,
        "verl 418f964ab (#3984), migration guide: the level (token / sequence) is rollout_correction.rollout_is",
    ),
    ("ppo", "algorithm.rollout_is"): (
        "algorithm.rollout_correction.rollout_is",
        False,
        "verl 418f964ab (#3984), migration guide: rollout_is=false is rollout_correction null; on is a level",
    ),
    ("ppo", "algorithm.rollout_is_threshold"): (
        "algorithm.rollout_correction.rollout_is_threshold",
        True,
        "verl 418f964ab (#3984), migration guide",
    ),
    ("ppo", "algorithm.rollout_is_mode"): (
        "algorithm.rollout_correction.rollout_rs",
        False,
        "verl 418f964ab (#3984), migration guide: mode mask became rejection sampling (rollout_rs)",
    ),
    ("ppo", "algorithm.rollout_is_threshold_lower"): (
        "algorithm.rollout_correction.rollout_rs_threshold",
        False,
        "verl 418f964ab (#3984): the mask's bounds became rejection sampling's; docs/algo/rollout_corr.md at "
        "b178a3cd: both bounds in rollout_rs_threshold as 'lower_upper'",
    ),
    ("ppo", "algorithm.rollout_is_veto_threshold"): (
        "algorithm.rollout_correction.rollout_token_veto_threshold",
        True,
        "verl 418f964ab (#3984): the per-token veto moved into rollout_correction",
    ),
    ("ppo", "algorithm.rollout_correction.rollout_token_veto_threshold"): (
        "algorithm.rollout_correction.rollout_rs",
        False,
        "verl 97eac9048 (#4544): the veto became a rejection-sampling mode of rollout_rs (max criterion)",
    ),
    ("ppo", "algorithm.rollout_correction.rollout_rs_threshold_lower"): (
        "algorithm.rollout_correction.rollout_rs_threshold",
        False,
        "docs/algo/rollout_corr.md at b178a3cd: the bounds are given as 'lower_upper' in rollout_rs_threshold",
    ),
    ("ppo", "algorithm.rollout_correction.use_policy_gradient"): (
        "algorithm.rollout_correction.loss_type",
        False,
        "verl 518bada21 (#4511), commit message: use_policy_gradient: bool replaced by loss_type: str",
    ),
}
HEADER = '''"""verl's keys of its releases of the last year ({releases}) that its config at b178a3cd lacks: key -> (its
defaults in those releases, the last release that had it, verl's key for it now or None where verl dropped the
setting, whether that key takes the same values). Generated by `python scripts/gen_verl_removed_keys.py` from
tests/verl/data/verl_release_keys.json (Hydra's composition of each release's configs); do not edit.
config/verl/removed.py reads it."""

RELEASES = ({releases_tuple})

# fmt: off
'''


# --- the releases, from verl's git -------------------------------------------------------------------------


def release_tags(verl_git: Path) -> dict[str, date]:
    """verl's release tags (vX.Y.Z; no rc or post) and their commit dates."""
    git = ["git", "-C", str(verl_git)]
    tags = subprocess.run([*git, "tag"], capture_output=True, text=True, check=True).stdout.split()
    out = {}
    for tag in tags:
        if re.fullmatch(r"v\d+(\.\d+)*", tag):
            stamp = subprocess.run(
                [*git, "log", "-1", "--format=%cI", tag], capture_output=True, text=True, check=True
            ).stdout.strip()
            out[tag] = datetime.fromisoformat(stamp).date()
    return out


def select_releases(tags: dict[str, date], as_of: date) -> list[str]:
    """The releases of the year before `as_of`, or the last three releases when fewer than three are."""
    by_date = sorted(tags, key=lambda t: (tags[t], [int(n) for n in t[1:].split(".")]))
    within = [t for t in by_date if 0 <= (as_of - tags[t]).days <= 365]
    return within if len(within) >= 3 else [t for t in by_date if tags[t] <= as_of][-3:]


def composed_keys(folder: Path, configs: tuple[str, ...]) -> dict[str, list]:
    """key -> its defaults in `configs` of a verl config folder (those the folder has), composed by Hydra."""
    from tandem.config.verl.hydra_yaml import compose

    out: dict[str, list] = {}
    for name in configs:
        if (folder / f"{name}.yaml").is_file():
            for key, value in dotted_leaves(compose(folder / f"{name}.yaml")):
                if value not in out.setdefault(key, []):
                    out[key].append(value)
    return out


def read_releases(verl_git: Path) -> dict[str, Any]:
    """The release data: the releases chosen, and per table each key of their configs with the releases that
    have it and its defaults there."""
    tags = release_tags(verl_git)
    releases = select_releases(tags, AS_OF)
    data: dict[str, Any] = {
        "as_of": AS_OF.isoformat(),
        "releases": {t: tags[t].isoformat() for t in releases},
    }
    for _, table, configs in TABLES:
        keys: dict[str, list] = {}
        for tag in releases:
            archive = subprocess.run(
                ["git", "-C", str(verl_git), "archive", tag, "verl/trainer/config"],
                capture_output=True,
                check=True,
            ).stdout
            with tempfile.TemporaryDirectory() as tmp:
                with tarfile.open(fileobj=BytesIO(archive)) as tar:
                    tar.extractall(tmp, filter="data")
                for key, values in composed_keys(Path(tmp) / "verl/trainer/config", configs).items():
                    entry = keys.setdefault(key, [[], []])
                    entry[0].append(tag)
                    entry[1] += [v for v in values if v not in entry[1]]
        data[table] = dict(sorted(keys.items()))
    return data


def write_release_data(data: dict[str, Any]) -> None:
    """One line a key, so a change of verl's releases reads as a diff."""
    lines = ["{", f'"as_of": {json.dumps(data["as_of"])},', f'"releases": {json.dumps(data["releases"])},']
    for n, (_, table, _) in enumerate(TABLES):
        lines.append(f'"{table}": {{')
        entries = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in data[table].items()]
        lines += [e + ("," if i < len(entries) - 1 else "") for i, e in enumerate(entries)]
        lines.append("}" + ("," if n < len(TABLES) - 1 else ""))
    RELEASE_DATA.write_text("\n".join([*lines, "}"]) + "\n")


# --- the table ---------------------------------------------------------------------------------------------


def current_keys(configs: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """The keys of verl's current configs (leaves and the sections above them), and the leaves whose default is
    a mapping (verl takes any key under those: `+...override_config.attention_dropout=0`)."""
    table = composed_keys(VERL_CONFIG, configs)
    keys = {".".join(k.split(".")[:n]) for k in table for n in range(1, k.count(".") + 2)}
    open_maps = {k for k, values in table.items() if any(isinstance(v, dict) for v in values)}
    return keys, open_maps


def is_current(key: str, keys: set[str], open_maps: set[str]) -> bool:
    parts = key.split(".")
    return key in keys or any(".".join(parts[:n]) in open_maps for n in range(1, len(parts)))


def moved_to(key: str, keys: set[str]) -> str | None:
    """The one current key under the removed key's section with the same last name, if exactly one."""
    section, _, name = key.rpartition(".")
    found = [k for k in keys if k.endswith("." + name) and (not section or k.startswith(section + "."))]
    return found[0] if len(found) == 1 else None


def table(name: str, configs: tuple[str, ...], data: dict[str, Any]) -> dict[str, tuple]:
    keys, open_maps = current_keys(configs)
    releases = list(data["releases"])
    removed = {
        key: (tuple(defaults), max(have, key=releases.index))
        for key, (have, defaults) in data[name].items()
        if not is_current(key, keys, open_maps)
    }
    out = {}
    for key, (defaults, last) in sorted(removed.items()):
        current, same, seen = key, True, set()
        while current not in keys:  # follow verl's renames to the key it has now
            if current in seen:
                raise SystemExit(f"{name}: the renames of {key} go round in a circle")
            seen.add(current)
            if (name, current) in RENAMES:
                target, same_values, _ = RENAMES[(name, current)]
                current, same = target, same and same_values
            elif (target := moved_to(current, keys)) is not None:
                current = target
            else:
                current, same = None, False
                break
        out[key] = (defaults, last, current, same)
    for (table_name, key), (target, _, _) in RENAMES.items():  # a rename nobody reads is a stale entry
        if table_name == name and key not in removed and key not in keys:
            raise SystemExit(
                f"RENAMES names {key}, which is neither removed from nor kept in verl's {name} config"
            )
        if table_name == name and target not in keys and (name, target) not in RENAMES:
            raise SystemExit(f"RENAMES: {target} is not a key of verl's current {name} config")
    return out


def render(data: dict[str, Any] | None = None) -> str:
    data = data if data is not None else json.loads(RELEASE_DATA.read_text())
    releases = tuple(data["releases"])
    blocks = []
    for variable, name, configs in TABLES:
        lines = [f"# {', '.join(c + '.yaml' for c in configs)}", f"{variable}: dict[str, tuple] = {{"]
        lines += [f"    {key!r}: {entry!r}," for key, entry in table(name, configs, data).items()]
        blocks.append("\n".join([*lines, "}"]) + "\n")
    header = HEADER.format(releases=", ".join(releases), releases_tuple=", ".join(f'"{r}"' for r in releases))
    return header + "\n".join(blocks) + "# fmt: on\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--verl-git", type=Path, help="a verl git folder: re-read the releases' configs first"
    )
    args = parser.parse_args()
    if args.verl_git:
        write_release_data(read_releases(args.verl_git))
        print(f"wrote {RELEASE_DATA.relative_to(ROOT)}")
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(ROOT)}")
    data = json.loads(RELEASE_DATA.read_text())
    for _, name, configs in TABLES:
        entries = table(name, configs, data).values()
        renamed = sum(1 for *_, current, same in entries if current and same)
        replaced = sum(1 for *_, current, same in entries if current and not same)
        dropped = len(entries) - renamed - replaced
        print(f"  {name}: {len(entries)} removed; {renamed} renamed, {replaced} replaced, {dropped} dropped")
