"""Writes src/tandem/config/verl/defaults.json: verl's default value of every key of its configs, composed by Hydra
from verl's config folder (tests/verl/data/verl_config, verl/trainer/config at the commit the project tracks).
config/verl/defaults.py reads it: the verl translation accepts a key given at verl's own default value
(`trainer.default_hdfs_dir=null`) as if it were absent. tests/verl/test_verl_defaults.py fails when it is stale.

    python scripts/gen_verl_defaults.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tandem.config.verl.hydra_yaml import compose
from tandem.config.yaml_io import dotted_leaves

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src/tandem/config/verl/defaults.json"
VERL_CONFIG = ROOT / "tests/verl/data/verl_config"
# the table each command line's keys are read by: (name, verl's configs it unites)
TABLES = (
    ("rl", ("ppo_trainer", "ppo_megatron_trainer")),
    ("sft", ("sft_trainer", "sft_trainer_engine")),
    ("generation", ("generation",)),
)


def table(names: tuple[str, ...]) -> dict[str, list]:
    out: dict[str, list] = {}
    for name in names:
        for key, value in dotted_leaves(compose(VERL_CONFIG / f"{name}.yaml")):
            if value not in out.setdefault(key, []):
                out[key].append(value)
    return out


def render() -> str:
    blocks = []
    for name, configs in TABLES:  # a line per key, so a key greps with its defaults
        lines = [
            f"  {json.dumps(key)}: {json.dumps(values)}" for key, values in sorted(table(configs).items())
        ]
        blocks.append(f" {json.dumps(name)}: {{\n" + ",\n".join(lines) + "\n }")
    return '{\n "verl_commit": "b178a3cd",\n' + ",\n".join(blocks) + "\n}\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(ROOT)}")
