"""A tiny Qwen2-VL in the FSDP2 engine (engine/fsdp/vision.py): log-probs of image and text-only prompts equal
transformers' (fp32), and 2 ranks, one of which sees no image at all (its vision tower runs on a blank
image, weighted zero), equal 1 rank: log-probs, losses, gradient norms and the weights after two steps;
packed rows (their multimodal rope positions packed with them) equal padded ones, on 1 rank and on 2."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tandem.models.tiny_vlm import save_tiny_vlm

from . import vision_scenarios as vs
from .fsdp_scenarios import spawn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model")


@pytest.fixture(scope="module")
def runs(model_path, tmp_path_factory):
    return {
        world: spawn(vs.rank_fn, world, model_path, tmp_path_factory.mktemp(f"vision{world}"))
        for world in (1, 2)
    }


@pytest.fixture(scope="module")
def packed_runs(model_path, tmp_path_factory):
    return {
        world: spawn(vs.packed_rank_fn, world, model_path, tmp_path_factory.mktemp(f"packed{world}"))
        for world in (1, 2)
    }


def test_log_probs_of_image_and_text_prompts_equal_transformers(model_path, runs):
    from transformers import AutoModelForImageTextToText

    from tandem.models.without_torchvision import adapt_transformers

    adapt_transformers()
    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
    batch = vs.prompt_batch(model_path)
    engine = runs[1][0]
    assert engine["packing"] is False  # padded rows: the model computes its rope positions from the mask
    for row in range(len(batch)):
        real = batch["attention_mask"][row].bool()
        ids = batch["input_ids"][row][real][None]
        inputs = batch["multi_modal_inputs"][row] or {}
        with torch.no_grad():
            logits = model(
                input_ids=ids, mm_token_type_ids=(ids == model.config.image_token_id).long(), **inputs
            ).logits
        expected = logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        got = engine["log_probs"][row, -expected.shape[0] :]
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_two_ranks_one_without_images_equal_one_rank(model_path, runs, packed_runs, layout):
    """Packed: 1 packed rank against 1 padded one first (rows 2 and 0 hold images: packed longest first,
    row 2's features come first in the packed rows), then 2 packed ranks as 2 padded ones against 1."""
    one, two = runs[1][0], (runs if layout == "padded" else packed_runs)[2]
    if layout == "packed":
        packed = packed_runs[1][0]
        assert packed["packing"] is True and all(rank["packing"] for rank in two)
        real = vs.predicted(vs.prompt_batch(model_path)["attention_mask"]).bool()
        torch.testing.assert_close(packed["log_probs"][real], one["log_probs"][real], rtol=0, atol=1e-5)
        for step in range(2):
            assert packed["steps"][step].loss == pytest.approx(one["steps"][step].loss, abs=1e-5)
            assert packed["steps"][step].grad_norm == pytest.approx(one["steps"][step].grad_norm, rel=1e-5)
    log_probs = torch.cat([two[0]["log_probs"], two[1]["log_probs"]])[[0, 2, 1, 3]]
    torch.testing.assert_close(log_probs, one["log_probs"], rtol=0, atol=1e-5)
    for step in range(2):
        for rank in two:
            assert rank["steps"][step].loss == pytest.approx(one["steps"][step].loss, abs=1e-5)
            assert rank["steps"][step].grad_norm == pytest.approx(one["steps"][step].grad_norm, rel=1e-5)
    assert one["state"].keys() == two[0]["state"].keys()
    for name, tensor in one["state"].items():
        torch.testing.assert_close(two[0]["state"][name], tensor, rtol=0, atol=1e-5)
    # the vision tower trained, on both ranks alike: its weights moved from the folder's (saved as visual.*)
    initial = load_file(model_path / "model.safetensors")
    vision = [name for name in one["state"] if name.startswith("model.visual.")]
    assert vision and all(not torch.equal(one["state"][n], initial[n.removeprefix("model.")]) for n in vision)
