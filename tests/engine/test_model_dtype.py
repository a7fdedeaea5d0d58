"""actor.fsdp.model_dtype=bfloat16 (verl's fsdp_config.model_dtype=bf16): the FSDP2 engine keeps its weights, their
gradients and AdamW's state in bf16, its buffers (rotary frequencies) in fp32; with a bf16 compute dtype its
forward equals the fp32-master engine's, since both compute with the same bf16-rounded weights (one gloo rank in
this process, the tiny model)."""

from __future__ import annotations

import torch

from tandem.config.schema_engine import FSDPConfig

from .fsdp_scenarios import logits_fn, make_engine, rollout_batch, train


def test_bf16_master_weights_and_optimizer_state_compute_as_fp32_masters_at_bf16(one_rank):
    probe = rollout_batch(4, seed=1)
    fp32_master = make_engine(one_rank, "lm", fsdp=FSDPConfig(param_dtype="bfloat16"))
    expected = fp32_master.forward(probe, logits_fn, 2)["logits"]
    del fp32_master

    engine = make_engine(one_rank, "lm", fsdp=FSDPConfig(param_dtype="bfloat16", model_dtype="bfloat16"))
    params = dict(engine.model.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.bfloat16}
    assert {b.dtype for b in engine.model.buffers() if b.is_floating_point()} == {torch.float32}
    torch.testing.assert_close(engine.forward(probe, logits_fn, 2)["logits"], expected, rtol=0, atol=0)

    before = {name: p.detach().full_tensor().clone() for name, p in params.items()}
    train(engine, "lm", rollout_batch(6, seed=2), world=1, rank=0)
    states = [s for s in engine.optimizer.state.values() if s]
    assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.bfloat16 for s in states)
    after = {name: p.detach().full_tensor() for name, p in params.items()}
    assert all(after[name].dtype == torch.bfloat16 for name in after)
    assert any(not torch.equal(after[name], before[name]) for name in after)  # the step moved the weights
    # the exported / synced weights are the bf16 ones
    assert {t.dtype for _, t in engine.state_dict_iter()} == {torch.bfloat16}
