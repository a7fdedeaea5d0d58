"""The override lists of three more of verl's example scripts, read from tests/verl/data/examples.json
(examples_data.py): DAPO's recipe as the GMPO example runs it (the overlong penalty of verl's dapo reward
manager, the geometric-mean policy loss), GRPO on geo3k with Qwen2.5-VL (images in the rows) and ReMax (a
greedy baseline per prompt). `$HOME/...` paths stand for the user's files. test_verl_scripts_e2e.py runs each
for 2 steps, changing only paths and the sizes 2 CPU cores cannot hold.
"""

from .examples_data import example_overrides

DAPO_QWEN3_30B_MATH = example_overrides("examples/gmpo_trainer/test_dapo_qwen3_30b_math.sh")
GRPO_QWEN25_VL_7B_GEO3K = example_overrides("examples/grpo_trainer/run_qwen2_5_vl-7b.sh")
REMAX_QWEN25_3B = example_overrides("examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh")
