"""The override lists of verl's two example generation scripts (generation/run_deepseek_v2_lite_math.sh and
generation/run_deepseek7b_mutli_node.sh), read from tests/verl/data/examples.json (examples_data.py): what each
passes to `python3 -m verl.trainer.main_generation`. `$HOME/...` paths and the model name stand for the user's
files; `tests/verl/test_verl_generation.py` changes only the paths and the sizes 2 CPU cores cannot hold.
"""

from .examples_data import example_overrides

DEEPSEEK_V2_LITE_MATH = example_overrides("examples/generation/run_deepseek_v2_lite_math.sh")
DEEPSEEK7B_MULTI_NODE = example_overrides("examples/generation/run_deepseek7b_mutli_node.sh")

GENERATION_SCRIPTS = {
    "deepseek_v2_lite_math": DEEPSEEK_V2_LITE_MATH,
    "deepseek7b_multi_node": DEEPSEEK7B_MULTI_NODE,
}
