"""Ulysses sequence parallel (`actor.fsdp.sequence_parallel`, engine/fsdp/ulysses.py) with real FSDP2 over gloo.

Parity: the roles' numbers (log-probs, entropy, SFT log-probs, values), a training step's loss and gradient
norm, the weights after it and after a step where a data-parallel rank has no rows, and the outputs after
both steps, on 2 ranks (SP 2) and 4 ranks (DP 2 x SP 2; SP 4 with the tiny model's 2 key/value heads
repeated), equal one rank's. Measured float32 differences: outputs <= 2e-6, loss <= 1e-7 relative, gradient
norm <= 3e-6 relative, weights <= 2e-6 (asserted 1e-5 each). Padded cases are compared at real tokens only
(padding positions hold whatever the model computed there, in either layout).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tandem.config import ConfigError, load_config
from tandem.config.schema import FSDPConfig
from tandem.data.packing import pack_model_inputs
from tandem.engine.fsdp.ulysses import (
    ULYSSES,
    SequenceParallel,
    check_heads,
    full_mask,
    pad_columns,
    sequence_parallel_groups,
    sp_attention,
    sp_forward,
)
from tandem.models.tiny import save_tiny
from tandem.trainer.start_checks.available import check_available

from . import ulysses_scenarios as us
from .fsdp_scenarios import file_store, rollout_batch

TOL = 1e-5


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("ulysses") / "tiny")


@pytest.fixture(scope="module")
def runs(tiny_path, tmp_path_factory):
    """Results by world size: 1 (the reference), 2 and 4 ranks, each a list of per-rank dicts."""
    return {world: us.run(world, tiny_path, tmp_path_factory.mktemp(f"world{world}")) for world in (1, 2, 4)}


@pytest.fixture
def world_of_one(tmp_path):
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=file_store(tmp_path), rank=0, world_size=1)
    yield dist.group.WORLD
    if created:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- no second rank needed
def test_full_mask_by_hand():
    # one row: a packed sequence of 3, one of 2, a pad column appended (position 0, not real)
    positions = torch.tensor([[0, 1, 2, 0, 1, 0]])
    real = torch.tensor([[1, 1, 1, 1, 1, 0]])
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [0, 0, 0, 1, 0, 0],
            [0, 0, 0, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],  # the pad sees itself only: finite, never read
        ],
        dtype=torch.bool,
    )
    assert torch.equal(full_mask(positions, real), expected[None, None])
    # a left-padded row: pads at position 0 see themselves; real tokens see the real ones before them
    padded = full_mask(torch.tensor([[0, 0, 1, 2]]), torch.tensor([[0, 1, 1, 1]]))[0, 0]
    assert torch.equal(padded[3], torch.tensor([False, True, True, True]))
    assert torch.equal(padded[0], torch.tensor([True, False, False, False]))


def test_pad_columns():
    x = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert torch.equal(pad_columns(x, 2, 9), torch.tensor([[1, 2, 3, 9], [4, 5, 6, 9]]))
    assert pad_columns(x, 3, 9) is x
    assert pad_columns(x, 4, 0).shape == (2, 4)


def test_heads_that_do_not_split_are_refused():
    from transformers import Qwen2Config, Qwen2VLConfig

    def config(heads: int, kv_heads: int) -> Qwen2Config:
        return Qwen2Config(hidden_size=12 * heads, num_attention_heads=heads, num_key_value_heads=kv_heads)

    check_heads(config(4, 2), 2)
    check_heads(config(4, 2), 4)  # kv heads repeated
    with pytest.raises(ValueError, match="num_attention_heads=6 is not a multiple of 4"):
        check_heads(config(6, 6), 4)
    with pytest.raises(ValueError, match="num_key_value_heads=3 neither divides by 2"):
        check_heads(config(6, 3), 2)
    # a vision-language config: its text part's heads
    vision_language = Qwen2VLConfig(text_config={"num_attention_heads": 6, "num_key_value_heads": 6})
    with pytest.raises(ValueError, match="num_attention_heads=6 is not a multiple of 4"):
        check_heads(vision_language, 4)


def test_settings_that_cannot_run_are_refused_with_their_keys():
    with pytest.raises(ValueError, match="sequence_parallel=2 must be >= 1 and divide the world size 3"):
        sequence_parallel_groups(FSDPConfig(sequence_parallel=2), torch.device("cpu"), 3)
    with pytest.raises(ValueError, match="actor.fsdp.torch_compile=true with actor.fsdp.sequence_parallel"):
        sequence_parallel_groups(FSDPConfig(sequence_parallel=2, torch_compile=True), torch.device("cpu"), 2)
    assert sequence_parallel_groups(FSDPConfig(), torch.device("cpu"), 2) == (None, None)
    assert sp_attention(FSDPConfig(sequence_parallel=2), "sdpa") == ULYSSES
    with pytest.raises(ValueError, match="attn_implementation=eager with actor.fsdp.sequence_parallel=2"):
        sp_attention(FSDPConfig(sequence_parallel=2, attn_implementation="eager"), "eager")


def test_the_attention_runs_only_inside_the_engine(tiny_path):
    config = Qwen2Config.from_pretrained(tiny_path)
    config._attn_implementation = ULYSSES
    model = Qwen2ForCausalLM(config)
    with pytest.raises(RuntimeError, match="only inside the FSDP2 engine"):
        model(input_ids=torch.tensor([[1, 2, 3]]))


def test_a_group_of_one_equals_transformers(tiny_path, world_of_one):
    """The mask and attention path with no exchange: packed and padded rows, and a sliding-window model,
    give transformers' own sdpa numbers at every real token."""
    sp = SequenceParallel(world_of_one, 1, 0)
    batch = rollout_batch(4, seed=7)
    real = batch["attention_mask"].bool()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    for sliding_window in (None, 3):
        settings = Qwen2Config.from_pretrained(tiny_path).to_dict()
        if sliding_window is not None:  # every layer windowed (layer_types made again from these)
            settings.update(use_sliding_window=True, sliding_window=3, max_window_layers=0, layer_types=None)
        config = Qwen2Config.from_dict(settings)
        assert (config.layer_types[0] == "sliding_attention") == (sliding_window is not None)
        plain = AutoModelForCausalLM.from_pretrained(
            tiny_path, config=config, attn_implementation="sdpa"
        ).eval()
        ours = AutoModelForCausalLM.from_pretrained(
            tiny_path, config=config, attn_implementation=ULYSSES
        ).eval()
        with torch.no_grad():
            expected = plain(**inputs, use_cache=False).logits
            padded = sp_forward(ours, inputs, sp=sp, pad_id=0)
            packed_inputs, packing = pack_model_inputs(batch["input_ids"], batch["attention_mask"], 0)
            packed = packing.unpack(sp_forward(ours, packed_inputs, sp=sp, pad_id=0))
        torch.testing.assert_close(padded[real], expected[real], rtol=0, atol=TOL)
        torch.testing.assert_close(packed[real], expected[real], rtol=0, atol=TOL)
        if sliding_window is not None:  # the window changed something: the test could fail
            full = AutoModelForCausalLM.from_pretrained(tiny_path, attn_implementation="sdpa").eval()
            with torch.no_grad():
                unwindowed = full(**inputs, use_cache=False).logits
            assert (unwindowed[real] - expected[real]).abs().max() > 1e-3


# ---------------------------------------------------------------------------- parity on 2 and 4 ranks
def masked(case_head: str, key: str, values: torch.Tensor) -> torch.Tensor:
    """A forward output at the real tokens it describes (the probe batch's masks)."""
    batch = rollout_batch(6, seed=5)
    if key == "sft":  # position t scores token t + 1
        mask = batch["attention_mask"][:, :-1] * batch["attention_mask"][:, 1:]
        mask = torch.cat([mask, torch.zeros_like(mask[:, :1])], dim=1)
    else:
        mask = batch["response_mask"]
    return values[mask.bool()]


def cases():
    return [(world, case) for world in (2, 4) for case in us.CASES[world]]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("world", "case"), cases(), ids=lambda v: str(v))
def test_sequence_parallel_equals_one_rank(world, case, runs):
    head, sp = case[0], case[1]
    dp = world // sp
    reference = runs[1][0][next(c for c in us.REFERENCE if c[0] == head)]
    ranks = [rank[case] for rank in runs[world]]
    # dispatch: the ranks of a group share a data-parallel index; the group's first answers
    assert [r["dispatch"] for r in ranks] == [(i // sp, dp, i % sp == 0) for i in range(world)]
    if case[2] is not None:
        assert ranks[0]["chunk"] == case[2]
    assert all(r["packing"] == case[3] for r in ranks)
    assert all(r["tokens"] == reference["tokens"] for r in ranks)  # counts summed over dp, not sp

    for key in ("forward", "after"):
        for name in reference[key].keys():
            gathered = torch.cat([ranks[d * sp][key][name] for d in range(dp)])  # the collectors, in order
            torch.testing.assert_close(
                masked(head, name, gathered), masked(head, name, reference[key][name]), rtol=0, atol=TOL
            )
        for i, r in enumerate(ranks):  # every rank of a group holds the group's outputs
            first = ranks[i // sp * sp]
            assert all(torch.equal(r[key][n], first[key][n]) for n in reference[key].keys())

    for step in ("step", "empty_step"):
        expected = reference[step]
        assert not expected["skipped"]
        for r in ranks:
            assert r[step]["loss"] == pytest.approx(expected["loss"], rel=TOL, abs=1e-7)
            assert r[step]["grad_norm"] == pytest.approx(expected["grad_norm"], rel=TOL)
    for state in ("state", "empty_state"):
        got, want = ranks[0][state], reference[state]
        assert got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=TOL, msg=name)
    moved = max((reference["empty_state"][k] - reference["state"][k]).abs().max() for k in reference["state"])
    assert moved > 1e-5  # the second step updated something, so its parity means something


def test_a_model_the_ranks_cannot_split_fails_before_the_workers(tiny_path):
    """The tiny model's 4 heads over 8 ranks: a start-up error naming the folder's key, before Ray starts."""
    cfg = load_config(
        "grpo",
        [f"actor.model_path={tiny_path}", "trainer.workers_per_node=8", "actor.fsdp.sequence_parallel=8"],
    )
    with pytest.raises(ConfigError, match=r"actor.model_path=.*num_attention_heads=4 is not a multiple of 8"):
        check_available(cfg)
    check_available(
        load_config(
            "grpo",
            [f"actor.model_path={tiny_path}", "trainer.workers_per_node=2", "actor.fsdp.sequence_parallel=2"],
        )
    )
