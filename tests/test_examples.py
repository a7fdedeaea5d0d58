"""Every recipe in examples/ resolves with `tandem config` for the GPUs it is written for (its
`# gpus_per_node: N` line), with a tiny model folder in place of the real one, so none goes stale.

`tandem config` does not read the model or the data; the sizes it checks (batch sizes against the ranks
that workers_per_node=auto gives on such a node, token budgets against the sequence length, tensor-parallel
sizes) are the real run's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tandem.cli import main
from tandem.models.tiny import save_tiny

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RECIPES = sorted(EXAMPLES.glob("*.yaml"))


def gpus_of(recipe: Path) -> int:
    found = re.search(r"^# gpus_per_node: (\d+)$", recipe.read_text(), re.MULTILINE)
    assert found, f"{recipe.name}: say the GPUs per node it is sized for in a '# gpus_per_node: N' line"
    return int(found.group(1))


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model")


def test_there_are_recipes_for_each_kind_of_run():
    names = {r.name for r in RECIPES}
    assert {
        "grpo_gsm8k_qwen2.5-0.5b_1gpu.yaml",
        "grpo_gsm8k_qwen2.5-7b_8gpu.yaml",
        "ppo_gsm8k_qwen2.5-0.5b_1gpu.yaml",
        "dapo_math_qwen2.5-7b_8gpu.yaml",
        "multiturn_gsm8k_calculator_qwen2.5-0.5b_1gpu.yaml",
        "lora_grpo_gsm8k_qwen2.5-7b_1gpu.yaml",
    } <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_recipe_resolves_for_its_gpus(recipe, tiny_folder, capsys):
    gpus = gpus_of(recipe)
    status = main(["config", str(recipe), f"actor.model_path={tiny_folder}", "--gpus-per-node", str(gpus)])
    out, err = capsys.readouterr()
    assert status == 0, err
    cfg = yaml.safe_load(out)
    trainer, data = cfg["trainer"], cfg["data"]
    assert trainer["workers_per_node"] == gpus  # auto: every GPU of the node
    assert trainer["device"] == "auto"
    # a real-size run never cuts prompts silently: an error at start-up or a filter that counts
    assert data["truncation"] in ("error", "filter")
    assert data["max_prompt_length"] >= 512 and data["max_response_length"] >= 512
    budget = cfg["actor"]["max_tokens_per_micro_batch"]
    assert budget >= data["max_prompt_length"] + data["max_response_length"]


def test_the_readme_trains_with_a_recipe():
    readme = (EXAMPLES.parent / "README.md").read_text()
    first = readme[readme.index("## Train your own model") :]
    command = first[first.index("```bash") : first.index("```", first.index("```bash") + 3)]
    assert re.search(r"tandem train examples/\S+\.yaml", command), command
    recipe = re.search(r"tandem train (examples/\S+\.yaml)", command).group(1)
    assert (EXAMPLES.parent / recipe).is_file()
