"""verl's configuration read as Tandem's: its keys on a command line, its Hydra YAML files, its SFT trainers'
keys and its main_generation keys, translated into Tandem overrides with a note for each key that changes
nothing or is refused. The one face the rest of Tandem uses; the tables and rules stay inside the package:

- `translate.py`: a verl command line / YAML tree -> Tandem overrides and notes (`VerlTranslation`), verl's
  layout rules and GPU counts, which keys are verl's;
- `keys.py` the table of verl's RL keys, with `extra_keys.py` (data, reward model, model, engine arguments),
  `megatron_keys.py`, `sft_keys.py`, `generation_keys.py`, `model_overrides.py`; `rules.py` the rule kinds,
  `values.py` the value conversions, `names.py` verl's names of things;
- `defaults.py` verl's default of every key (`defaults.json`, written by scripts/gen_verl_defaults.py from verl's
  real config folder), so a key given at verl's default reads as absent; `removed.py` / `removed_keys.py` the keys
  verl's releases had and removed (scripts/gen_verl_removed_keys.py);
- `hydra_yaml.py` a verl YAML composed by Hydra and OmegaConf themselves; `sft_trainers.py` which of verl's two SFT
  trainers a command line is written for; `hints.py` the "did you mean" for a verl key Tandem does not know;
  `dist_checkpoint.py` verl's megatron distributed checkpoint keys.

The package imports config's schema, errors and YAML helpers and nothing else of config (the loader imports it,
not the other way round): tests/test_structure.py checks that, and that no module outside it imports its
submodules. The generated index of the keys a glob covers is tests/verl/keys_index.py (for grep; nothing reads it).
"""

from tandem.config.verl.defaults import GENERATION_DEFAULTS
from tandem.config.verl.generation_keys import VERL_GENERATION_DEFAULTS, generation_rule
from tandem.config.verl.hydra_yaml import compose, looks_like_verl
from tandem.config.verl.keys import is_verl_key
from tandem.config.verl.removed import removed_key_message
from tandem.config.verl.rules import UnsupportedValue
from tandem.config.verl.sft_trainers import verl_sft_preset
from tandem.config.verl.translate import (
    VerlTranslation,
    accept_default,
    accept_old_default,
    apply_rule,
    is_tandem_key,
    is_verl_sft_key,
    layout_problems,
    translate_overrides,
    translate_tree,
    verl_sizes,
)

__all__ = [
    "GENERATION_DEFAULTS",
    "VERL_GENERATION_DEFAULTS",
    "UnsupportedValue",
    "VerlTranslation",
    "accept_default",
    "accept_old_default",
    "apply_rule",
    "compose",
    "generation_rule",
    "is_tandem_key",
    "is_verl_key",
    "is_verl_sft_key",
    "layout_problems",
    "looks_like_verl",
    "removed_key_message",
    "translate_overrides",
    "translate_tree",
    "verl_sft_preset",
    "verl_sizes",
]
