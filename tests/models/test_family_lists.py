"""docs/DESIGN.md's "where the next things go" for a model family, kept true: every model_type a list of Tandem's
declares supported (the tensor-parallel rollout's cuts, megatron's conversion) is one the tests build as a tiny
model and run (models/tiny.py's Qwen2 and Mixtral, models/tiny_families.py's FAMILIES), so a family added to a
list without a tiny model of it fails here."""

from __future__ import annotations

import ast
from pathlib import Path

from tandem.models.tiny import build_model, build_tokenizer
from tandem.models.tiny_families import FAMILIES, family_config
from tandem.models.tp_cuts import SHARDED_FAMILIES

CONVERT = Path(__file__).parents[2] / "src/tandem/engine/megatron/convert.py"


def _megatron_types() -> set[str]:
    """engine/megatron/convert.py's SUPPORTED_MODEL_TYPES, read from the source (megatron-core not imported)."""
    for node in ast.parse(CONVERT.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "SUPPORTED_MODEL_TYPES" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError("SUPPORTED_MODEL_TYPES not found in engine/megatron/convert.py")


def _tested_types() -> set[str]:
    tokenizer = build_tokenizer()
    small = {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1}
    dense = build_model(tokenizer, **small)
    moe = build_model(tokenizer, **small, num_experts=2, experts_per_token=1)
    return {dense.config.model_type, moe.config.model_type} | {family_config(f).model_type for f in FAMILIES}


def test_every_family_declared_supported_has_a_tiny_model():
    tested = _tested_types()
    assert tested >= {"qwen2", "mixtral", "llama", "qwen3", "qwen3_moe"}  # the reader works
    assert SHARDED_FAMILIES - tested == set(), "models/tp_cuts.py cuts families no tiny model tests"
    assert _megatron_types() - tested == set(), (
        "engine/megatron/convert.py converts families no tiny model tests"
    )
