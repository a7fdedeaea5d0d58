"""The override lists of verl's 10 SFT example scripts (examples/sft/**/*.sh), read from
tests/verl/data/examples.json (examples_data.py): (the module the script runs, the overrides it passes), its two
arguments (`<nproc_per_node> <save_path>`) `8 $HOME/sft_out` when extracted. `$HOME/...`, `$PWD/...` and
`$PROJECT_DIR/...` stand for the user's files. The key is the script's path under examples/
(`sft/gsm8k/run_gemma_2b.sh` is `sft_gsm8k_run_gemma_2b`).

`tests/verl/test_sft_scripts.py` reads each through `tandem config` as `tandem sft` does.
"""

from .examples_data import EXAMPLES, script_key

SFT_ENTRY_POINTS = ("verl.trainer.fsdp_sft_trainer", "verl.trainer.sft_trainer")

SFT_SCRIPTS: dict[str, tuple[str, list[str]]] = {
    script_key(entry["script"]): (entry["entry_point"], list(entry["overrides"]))
    for entry in EXAMPLES
    if entry["entry_point"] in SFT_ENTRY_POINTS
}
