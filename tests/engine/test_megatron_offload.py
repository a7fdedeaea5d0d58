"""The megatron engine's offload between calls (engine/megatron/offload.py; actor.megatron.param_offload /
grad_offload / optimizer_offload, reference.megatron_param_offload).

On a CPU device the engine moves nothing (its state is in host memory already). These tests run the moves there
anyway (`DEVICE_TYPES_WITH_OWN_MEMORY` gets "cpu"): each storage-owning tensor is copied to a host buffer and its
storage freed, then restored, exactly the path a CUDA device takes (less the pinned memory and the synchronize).
They check the bookkeeping (what is out between calls, what a call brings in) and the numbers: an engine that
offloads everything between calls gives the same log-probs, updates and weights, bit for bit, as one that does
not. The CUDA run of the same engine is tests/engine/test_megatron.py::test_cuda_bf16_step_offload_and_onload.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from tandem.engine.megatron import offload

from .ranks import start_ranks

pytest.importorskip("megatron.core")

ALL = {"params", "grads", "optimizer"}


def _storage_bytes(tensors) -> list[int]:
    return [t.untyped_storage().nbytes() for t in tensors]


# --- the mover on a plain module and torch's AdamW (no megatron) ------------------------------------------------


def _model_and_adam(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    adam = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, adam


def _adam_step(model, adam, x):
    adam.zero_grad()
    model(x).square().sum().backward()
    adam.step()


def test_parts_leave_their_storage_and_come_back_bit_for_bit(monkeypatch):
    monkeypatch.setattr(offload, "DEVICE_TYPES_WITH_OWN_MEMORY", {"cuda", "cpu"})
    model, adam = _model_and_adam(0)
    twin, twin_adam = _model_and_adam(0)
    x = torch.randn(3, 4)
    _adam_step(model, adam, x)
    _adam_step(twin, twin_adam, x)
    state = offload.StateOffload(
        torch.device("cpu"), [model], [model], SimpleNamespace(optimizer=adam), ["params", "optimizer"]
    )
    view = model[0].weight[:2]  # a view into a parameter keeps pointing at it across a move
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    moments = [v.clone() for s in adam.state.values() for v in s.values()]

    state.offload(state.switched)
    assert state.parked == {"params", "optimizer"}
    params = state.host_copies("params")
    assert len(params) == 4 and all(host.device.type == "cpu" for _, host in params)
    assert set(_storage_bytes(t for t, _ in params)) == {0}
    # Adam's moments and step counters (its master weights are the parameters, counted once, in params)
    assert len(state.host_copies("optimizer")) == 3 * 4
    assert set(_storage_bytes(t for t, _ in state.host_copies("optimizer"))) == {0}

    with state.on_device(offload.FORWARD, writes=False):  # a forward brings the parameters alone
        assert state.parked == {"optimizer"}
        for name, p in model.named_parameters():
            assert torch.equal(p, before[name])
        assert torch.equal(view, before["0.weight"][:2])
        with torch.no_grad():  # what a forward does not do: its parameters leave uncopied, as they came
            model[0].weight.add_(1.0)
    assert state.parked == {"params", "optimizer"}
    with state.on_device(offload.FORWARD, writes=False):
        assert torch.equal(model[0].weight, before["0.weight"])
    with state.on_device(offload.TRAIN, writes=True):
        assert state.parked == frozenset()
        assert all(
            torch.equal(a, b) for a, b in zip(moments, (v for s in adam.state.values() for v in s.values()))
        )
        _adam_step(model, adam, x)  # a step after a cycle equals one without
        _adam_step(twin, twin_adam, x)
        with state.on_device(offload.TRAIN, writes=True):  # nested: the outermost use moves the state out
            pass
        assert state.parked == frozenset()
    assert state.parked == {"params", "optimizer"}
    state.onload(offload.TRAIN)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p, q), name


def test_a_cpu_device_moves_nothing_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(offload, "_logged_cpu", False)
    model, adam = _model_and_adam(0)
    with caplog.at_level(logging.INFO, logger=offload.__name__):
        state = offload.StateOffload(
            torch.device("cpu"), [model], [model], SimpleNamespace(optimizer=adam), ALL
        )
    assert state.switched == frozenset() and not state.moves
    assert "megatron offload (params, grads, optimizer) on device cpu: nothing to move" in caplog.text
    state.offload(offload.PARTS)
    assert state.parked == frozenset()
    # a frozen engine keeps its parameters' switch alone; a part that is none of the three is an error
    assert offload.StateOffload(torch.device("cuda"), [], [], None, ALL).switched == {"params"}
    with pytest.raises(ValueError, match="each must be one of"):
        offload.StateOffload(torch.device("cuda"), [], [], None, ["activations"])


# --- a megatron engine (1 gloo rank, CPU, float32) --------------------------------------------------------------


def megatron_worker(rank: int, init_method: str, model_path: str, out_dir: str) -> None:
    """Engine `moving` (every part out between calls, the moves run on the CPU) against `plain` (no offload), on
    the same rows: the bookkeeping after each call and every number they give."""
    from tandem.config.schema import MegatronConfig
    from tandem.roles.actor import Actor
    from tandem.roles.common import MODEL_INPUTS, global_counts

    from . import megatron_scenarios as sc

    dist.init_process_group(
        "gloo", init_method=init_method, rank=0, world_size=1, timeout=timedelta(seconds=300)
    )
    torch.set_num_threads(1)
    offload.DEVICE_TYPES_WITH_OWN_MEMORY.add("cpu")
    try:
        cfg = sc.role_config(model_path, model_path)
        switches = MegatronConfig(param_offload=True, grad_offload=True, optimizer_offload=True)
        moving = sc.make_engine("megatron", model_path, "lm", switches)
        plain = sc.make_engine("megatron", model_path, "lm", MegatronConfig())
        batch = sc.rollout_batch()
        inputs = batch.select(*MODEL_INPUTS)
        r: dict = {"switched": set(moving._offload.switched), "parked_at_start": set(moving._offload.parked)}
        r["emptied_at_start"] = {
            part: sorted(set(_storage_bytes(t for t, _ in moving._offload.host_copies(part))))
            for part in offload.PARTS
        }
        r["grad_copies"] = {host is None for _, host in moving._offload.host_copies("grads")}
        r["grad_buffers"] = len(moving._offload.host_copies("grads"))

        logits = [e.forward(inputs, sc.full_logits(e), 2)["logits"] for e in (moving, plain)]
        r["forward_equal"] = torch.equal(*logits)
        r["parked_after_forward"] = set(moving._offload.parked)

        steps = []
        for engine in (moving, plain):
            counts = global_counts(engine, batch["response_mask"])
            steps.append(
                dataclasses.asdict(engine.train_step(batch, Actor(engine, cfg)._loss_fn(counts, batch), 2))
            )
        r["step_equal"] = steps[0] == steps[1]
        r["parked_after_step"] = set(moving._offload.parked)
        r["optimizer_tensors"] = len(moving._offload.host_copies("optimizer"))  # Adam's moments, after a step

        # the role's update (one scope over its optimizer steps), then the weights as the rollout reads them
        updates = [Actor(e, cfg).update(batch) for e in (moving, plain)]
        r["update_equal"] = updates[0] == updates[1]
        r["parked_after_update"] = set(moving._offload.parked)
        weights = [sc.weights(e) for e in (moving, plain)]
        r["weights_equal"] = all(torch.equal(weights[0][n], weights[1][n]) for n in weights[1])
        r["parked_after_weights"] = set(moving._offload.parked)
        with moving.on_device(train=True):  # the optimizer state as it came back
            r["parked_inside"] = set(moving._offload.parked)
            adam = [{k: v.clone() for k, v in s.items()} for s in _adam_states(moving)]
        twin = _adam_states(plain)
        r["optimizer_equal"] = all(
            torch.equal(a[k], b[k]) for a, b in zip(adam, twin, strict=True) for k in b
        )

        # the explicit offload() / onload() of TrainEngine: every part, a forward refused in between
        moving.offload()
        try:
            moving.forward(inputs, sc.full_logits(moving), 2)
        except RuntimeError as err:
            r["offloaded_forward_error"] = str(err)
        moving.onload()
        r["parked_after_onload"] = set(moving._offload.parked)
        again = moving.forward(inputs, sc.full_logits(moving), 2)["logits"]
        r["forward_after_onload_equal"] = torch.equal(
            again, plain.forward(inputs, sc.full_logits(plain), 2)["logits"]
        )

        # a checkpoint saved and loaded between calls; a frozen engine (the reference) with its own switch
        moving.save(Path(out_dir) / "ckpt")
        plain_after = sc.weights(plain)
        moving.load(Path(out_dir) / "ckpt")
        loaded = sc.weights(moving)
        r["load_equal"] = all(torch.equal(loaded[n], plain_after[n]) for n in plain_after)
        r["parked_after_load"] = set(moving._offload.parked)
        reference = sc.make_engine(
            "megatron", model_path, "lm", MegatronConfig(param_offload=True), optim=None
        )
        r["reference_switched"] = set(reference._offload.switched)
        fresh = sc.make_engine("megatron", model_path, "lm", MegatronConfig(), optim=None)
        r["reference_equal"] = torch.equal(
            reference.forward(inputs, sc.full_logits(reference), 2)["logits"],
            fresh.forward(inputs, sc.full_logits(fresh), 2)["logits"],
        )
        r["reference_parked"] = set(reference._offload.parked)
        torch.save(r, Path(out_dir) / "offload.pt")
    finally:
        dist.destroy_process_group()


def _adam_states(engine) -> list[dict]:
    optimizers = getattr(engine.optimizer, "chained_optimizers", [engine.optimizer])
    return [state for o in optimizers for state in o.optimizer.state.values()]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_engine_that_offloads_between_calls_equals_one_that_does_not(tmp_path):
    from tandem.models.tiny import save_tiny

    path = str(save_tiny(tmp_path / "policy"))
    init_method = f"file://{tmp_path / f'store-{uuid.uuid4().hex}'}"
    start_ranks(megatron_worker, (init_method, path, str(tmp_path)), 1)
    r = torch.load(tmp_path / "offload.pt", weights_only=False)

    assert r["switched"] == ALL and r["parked_at_start"] == ALL
    # parameters (no DDP parameter buffer without the distributed optimizer: the parameters themselves) and the
    # gradient buffer are out from the start; Adam's moments exist from the first step on
    assert r["emptied_at_start"] == {"params": [0], "grads": [0], "optimizer": []}
    assert r["grad_buffers"] >= 1 and r["grad_copies"] == {True}  # freed, not copied
    assert r["forward_equal"] and r["parked_after_forward"] == ALL
    assert r["step_equal"] and r["parked_after_step"] == ALL
    assert r["optimizer_tensors"] > 0
    assert r["update_equal"] and r["parked_after_update"] == ALL
    assert r["weights_equal"] and r["parked_after_weights"] == ALL
    assert r["parked_inside"] == set() and r["optimizer_equal"]
    assert "onload() first" in r["offloaded_forward_error"]
    assert r["forward_after_onload_equal"]
    assert r["parked_after_onload"] == set()
    assert r["load_equal"] and r["parked_after_load"] == ALL
    assert (
        r["reference_switched"] == {"params"} and r["reference_equal"] and r["reference_parked"] == {"params"}
    )


# --- CUDA: the moves for real (bfloat16, the distributed optimizer's parameter buffer) ----------------------------


def _cuda_engine(model_path: str, megatron, optim):
    from tandem.config.schema import FSDPConfig
    from tandem.engine import EngineSpec, build_engine

    from . import megatron_scenarios as sc

    return build_engine(
        EngineSpec(
            strategy="megatron",
            model_path=model_path,
            head="lm",
            device=torch.device("cuda", 0),
            optim=optim,
            fsdp=FSDPConfig(),
            megatron=megatron,
            grad_clip=sc.GRAD_CLIP,
            total_training_steps=sc.TOTAL_STEPS,
            packing=True,
            max_tokens_per_micro_batch=sc.BUDGET,
        )
    )


def cuda_worker(rank: int, init_method: str, model_path: str, out_dir: str) -> None:
    """`moving` (every part out between calls) against `plain` on one CUDA rank: memory between calls, the parts
    as they come back, and the numbers of a forward, a step and an update."""
    from tandem.config.schema import MegatronConfig
    from tandem.roles.actor import Actor
    from tandem.roles.common import MODEL_INPUTS, global_counts

    from . import megatron_scenarios as sc

    dist.init_process_group("nccl", init_method=init_method, rank=0, world_size=1)
    try:
        cfg = sc.role_config(model_path, model_path)
        switches = MegatronConfig(param_offload=True, grad_offload=True, optimizer_offload=True)
        plain = _cuda_engine(model_path, MegatronConfig(), sc.OPTIM)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        moving = _cuda_engine(model_path, switches, sc.OPTIM)
        r: dict = {"built_bytes": torch.cuda.memory_allocated() - base, "parked": set(moving._offload.parked)}
        batch = sc.rollout_batch()
        inputs = batch.select(*MODEL_INPUTS)
        logits = [e.forward(inputs, sc.full_logits(e), 2)["logits"] for e in (moving, plain)]
        r["forward_diff"] = float((logits[0] - logits[1]).abs().max())
        steps = []
        for engine in (moving, plain):
            counts = global_counts(engine, batch["response_mask"])
            steps.append(
                dataclasses.asdict(engine.train_step(batch, Actor(engine, cfg)._loss_fn(counts, batch), 2))
            )
        r["steps"] = steps
        updates = [Actor(e, cfg).update(batch) for e in (moving, plain)]
        r["updates"] = updates
        weights = [sc.weights(e) for e in (moving, plain)]
        r["weights_diff"] = max(
            float((weights[0][n].float() - weights[1][n].float()).abs().max()) for n in weights[1]
        )
        torch.cuda.synchronize()
        between = torch.cuda.memory_allocated()
        with moving.on_device(train=True):
            torch.cuda.synchronize()
            r["resident_bytes"] = torch.cuda.memory_allocated() - between
            owners = moving._offload._owners()
            r["owners"] = {part: len(tensors) for part, tensors in owners.items()}
            snapshot = {part: [t.clone() for t in owners[part]] for part in ("params", "optimizer")}
        r["parked_after"] = set(moving._offload.parked)
        r["host_pinned"] = {
            h.is_pinned() for part in ("params", "optimizer") for _, h in moving._offload.host_copies(part)
        }
        with moving.on_device(train=True):
            again = moving._offload._owners()
            r["cycle_bit_for_bit"] = all(
                torch.equal(a, b)
                for part in snapshot
                for a, b in zip(snapshot[part], again[part], strict=True)
            )
            r["grads_zero"] = all(int(t.count_nonzero()) == 0 for t in again["grads"])
        torch.save(r, Path(out_dir) / "cuda.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.timeout(600)
def test_cuda_offload_between_calls_frees_the_gpu_and_changes_no_number(tmp_path):
    from tandem.models.tiny import save_tiny

    path = str(save_tiny(tmp_path / "policy"))
    init_method = f"file://{tmp_path / f'store-{uuid.uuid4().hex}'}"
    start_ranks(cuda_worker, (init_method, path, str(tmp_path)), 1)
    r = torch.load(tmp_path / "cuda.pt", weights_only=False)
    print({k: v for k, v in r.items() if k not in ("steps", "updates")})  # the numbers, for the log
    assert r["parked"] == ALL
    assert r["owners"]["params"] >= 1 and r["owners"]["grads"] >= 1 and r["owners"]["optimizer"] >= 1
    assert r["resident_bytes"] > 1e6 and r["built_bytes"] < r["resident_bytes"] / 2
    assert r["parked_after"] == ALL and r["host_pinned"] == {True}
    assert r["cycle_bit_for_bit"] and r["grads_zero"]
    assert r["forward_diff"] < 1e-2  # bfloat16: two engines, the same kernels
    for moved, kept in zip(r["steps"], r["steps"][1:]):
        assert moved["loss"] == pytest.approx(kept["loss"], rel=1e-3)
        assert moved["grad_norm"] == pytest.approx(kept["grad_norm"], rel=1e-2)
    assert r["updates"][0]["actor/pg_loss"] == pytest.approx(
        r["updates"][1]["actor/pg_loss"], rel=1e-2, abs=1e-4
    )
    assert r["weights_diff"] < 1e-2
