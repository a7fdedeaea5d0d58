"""scripts/gen_verl_keys.py as a module, for the tests that check its index and read verl's config keys with it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_generator() -> ModuleType:
    """The generator module (loaded once per process; scripts/ is not a package)."""
    if "gen_verl_keys" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gen_verl_keys", ROOT / "scripts/gen_verl_keys.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["gen_verl_keys"]
