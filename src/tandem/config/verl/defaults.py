"""verl's default value of every key of its configs (verl/trainer/config at the commit the project tracks, composed
by Hydra): defaults.json, written by `python scripts/gen_verl_defaults.py`. Each table maps a key to the
defaults it has in the configs of one kind of command line (two where ppo_trainer and ppo_megatron_trainer, or the
two SFT trainers, differ)."""

from __future__ import annotations

import json
from pathlib import Path

_TABLES = json.loads((Path(__file__).with_name("defaults.json")).read_text())

RL_DEFAULTS: dict[str, list] = _TABLES["rl"]  # ppo_trainer.yaml, ppo_megatron_trainer.yaml
SFT_DEFAULTS: dict[str, list] = _TABLES["sft"]  # sft_trainer.yaml, sft_trainer_engine.yaml
GENERATION_DEFAULTS: dict[str, list] = _TABLES["generation"]  # generation.yaml (tandem generate)
