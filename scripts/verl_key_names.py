"""Write src/tandem/config/verl/names.py: the dotted keys of verl's trainer, megatron and SFT configs.

    python scripts/verl_key_names.py VERL_CHECKOUT > src/tandem/config/verl/names.py

Read from verl's generated configs (verl/trainer/config/_generated_ppo_trainer.yaml,
_generated_ppo_megatron_trainer.yaml) and its SFT configs (sft_trainer.yaml, sft_trainer_engine.yaml with the
model / engine / optim files it names): the keys' names only, as facts; Tandem uses them to tell a verl key it
does not support from a misspelled one (config/verl/translate.py).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import yaml

FILES = [
    ("", "_generated_ppo_trainer.yaml"),
    ("", "_generated_ppo_megatron_trainer.yaml"),
    ("", "sft_trainer.yaml"),
    ("", "sft_trainer_engine.yaml"),
    ("model.", "model/hf_model.yaml"),
    ("engine.", "engine/fsdp.yaml"),
    ("engine.", "engine/megatron.yaml"),
    ("optim.", "optim/fsdp.yaml"),
    ("optim.", "optim/megatron.yaml"),
    ("profiler.", "profiler/profiler.yaml"),
]


def leaves(tree, prefix=""):
    for key, value in tree.items():
        if key in ("defaults", "_target_") or key.startswith("hydra"):
            continue
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from leaves(value, path + ".")
        else:
            yield path


def main(root: str) -> int:
    config = Path(root) / "verl" / "trainer" / "config"
    keys: set[str] = set()
    for prefix, name in FILES:
        if (config / name).is_file():
            keys.update(prefix + k for k in leaves(yaml.safe_load((config / name).read_text()) or {}))
    groups: dict[str, list[str]] = defaultdict(list)
    for key in sorted(keys):
        head, _, last = key.rpartition(".")
        groups[head].append(last)
    print('"""The dotted keys of verl\'s configs (trainer, megatron, SFT; verl b178a3c), written by')
    print(
        "scripts/verl_key_names.py: names only. config/verl/translate.py tells by them a verl key Tandem does not support"
    )
    print('from a misspelled one."""')
    print()
    print("_BY_SECTION = {")
    for head, names in groups.items():
        print(f"    {head!r}: {' '.join(names)!r},")
    print("}")
    print()
    print("VERL_NAMES = frozenset(")
    print(
        '    f"{section}.{name}" if section else name for section, names in _BY_SECTION.items() for name in names.split()'
    )
    print(")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
