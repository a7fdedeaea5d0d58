"""The FSDP2 engine's start-up check of a model folder's kind (engine/hf_io.py `unloadable_folders`, run by
`FSDPEngine.check_buildable` before any worker starts): a folder is refused exactly when `auto_class` has no model
class for it under the role's head, or when it names code of its own; read from config.json alone."""

from __future__ import annotations

import json

import pytest

from tandem.config.schema import FSDPConfig
from tandem.engine.fsdp.engine import FSDPEngine
from tandem.engine.hf_io import unloadable_folders


def _folder(tmp_path, name: str, **config) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize(
    ("key", "config", "why"),
    [
        ("actor.model_path", {"model_type": "qwen2"}, None),
        ("actor.model_path", {"model_type": "qwen2_vl"}, None),  # an image-text model, built as the policy
        ("critic.model_path", {"model_type": "llama"}, None),  # a causal-LM folder makes a token classifier
        (
            "actor.model_path",
            {"model_type": "qwen2_5_vl"},
            "a 'qwen2_5_vl' vision-language model; the FSDP2 engine builds qwen2_vl",
        ),
        ("critic.model_path", {"model_type": "qwen2_vl"}, "the FSDP2 engine builds qwen2_vl (as the policy)"),
        (
            "reward.reward_model.model_path",
            {"model_type": "qwen2", "auto_map": {"AutoModel": "modeling.Model"}},
            "names code of its own (auto_map, model_type 'qwen2')",
        ),
        (
            "actor.model_path",
            {"model_type": "not_a_kind"},
            "model_type 'not_a_kind': transformers has no causal LM of this kind",
        ),
    ],
)
def test_a_folder_is_refused_when_its_role_has_no_class_for_it(tmp_path, key, config, why):
    folder = _folder(tmp_path, "model", **config)
    problems = unloadable_folders({key: folder})
    if why is None:
        assert problems == []
    else:
        ((problem,),) = [problems]
        assert problem.startswith(f"{key}={folder}: ") and why in problem


def test_the_engine_s_start_up_check_reads_it_and_passes_over_a_folder_without_config(tmp_path):
    bad = _folder(tmp_path, "vl", model_type="glm4v")
    folders = {"actor.model_path": bad, "critic.model_path": str(tmp_path / "nothing")}
    (problem,) = FSDPEngine.check_buildable(FSDPConfig(), folders)
    assert problem.startswith(f"actor.model_path={bad}: a 'glm4v' vision-language model")
