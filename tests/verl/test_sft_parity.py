"""`tandem sft` on verl 0.9.1 `sft_trainer` command lines makes verl's update: the same loss and gradient norm at
each of 4 steps, and the same weights after them (fp32, CPU), for the cases of data/sft_parity/verl.json.

verl's numbers were made by verl 0.9.1's own trainer on the same tiny model, rows and lines
(`scripts/sft_parity_verl.py`, whose docstring says how to rerun it and what a CPU run of verl changes). The
weights must agree within 1e-5 (the update of 4 steps is about 4e-3 per weight; float noise leaves about 1e-7):
tighter than 1e-4, so that, e.g., weight decay left off the norms (4e-5 in 4 steps) would fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tandem.cli import main
from tandem.data.synthetic import write_rows
from tandem.models.tiny import save_tiny

DATA = Path(__file__).parent / "data" / "sft_parity"
VERL = json.loads((DATA / "verl.json").read_text())
WEIGHT_TOL = 1e-5
LOSS_TOL = 1e-5


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The tiny model verl started from (rebuilt from its seed) and each set of rows as a parquet."""
    root = tmp_path_factory.mktemp("sft_parity")
    model = save_tiny(root / "model", **VERL["model"])
    start = load_file(model / "model.safetensors")
    sums = {key: float(value.double().sum()) for key, value in sorted(start.items())}
    assert sums == pytest.approx(VERL["start_sums"], abs=1e-6), (
        "the tiny model rebuilt here is not the one verl trained: rerun scripts/sft_parity_verl.py"
    )
    rows = {
        name: write_rows([{"messages": r} for r in rows], root / f"{name}.parquet")
        for name, rows in VERL["rows"].items()
    }
    return root, model, rows


@pytest.fixture(scope="module")
def verl_weights():
    return load_file(DATA / "weights.safetensors")


@pytest.mark.parametrize("case", list(VERL["cases"]))
def test_tandem_sft_makes_verls_update(case, inputs, verl_weights):
    root, model, rows = inputs
    verl = VERL["cases"][case]
    run = root / case
    line = [
        *verl["line"],
        f"data.train_files={rows[verl['rows']]}",
        f"data.train_batch_size={len(VERL['rows'][verl['rows']])}",  # every row each step: no sampler order
        f"model.path={model}",
        f"trainer.default_local_dir={run}",
        "trainer.backend=inprocess",
        "trainer.progress_bar=false",
    ]
    assert main(["sft", *line]) == 0
    steps = [m for m in map(json.loads, (run / "metrics.jsonl").open()) if "sft/loss" in m]
    assert [m["sft/loss"] for m in steps] == pytest.approx(verl["loss"], abs=LOSS_TOL)
    assert [m["sft/grad_norm"] for m in steps] == pytest.approx(verl["grad_norm"], abs=LOSS_TOL)
    # verl logs the rate after the scheduler's step (the next step's), Tandem the one the step used
    assert [m["sft/lr"] for m in steps][1:] == pytest.approx(verl["lr"][:-1], rel=1e-6)

    trained = load_file(run / "hf_model" / "model.safetensors")
    prefix = f"{case}/"
    names = [key[len(prefix) :] for key in verl_weights if key.startswith(prefix)]
    assert names
    diffs = {name: (trained[name] - verl_weights[prefix + name]).abs().max().item() for name in names}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] < WEIGHT_TOL, f"{worst} differs from verl's by {diffs[worst]:.2e}"
    # the update is far above the tolerance: a run that moved no weight would fail
    start = load_file(model / "model.safetensors")
    assert min((trained[n] - start[n]).abs().max().item() for n in names) > 100 * WEIGHT_TOL
    assert torch.isfinite(trained[worst]).all()
