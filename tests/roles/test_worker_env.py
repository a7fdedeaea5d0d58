"""On a CPU, every Ray worker group of a run gets the controller's `param_dtype=auto` choice (the one its device
line prints) in its environment, so no worker times its own (engine/auto_dtype.py `worker_env`). Ray itself is
not started here: the groups' constructor is replaced by one that records what it is given (the real groups'
environment reaches Ray's runtime_env in controller/ray_backend.py)."""

from __future__ import annotations

import pytest
import torch

from tandem.engine import auto_dtype
from tandem.models.tiny import save_tiny
from tandem.roles import layout
from tandem.trainer.device_line import device_line

from .roles_helpers import tiny_config


class _Group:
    """Stands for a started group: any method, its `.async_` and the future's `.result()` return it."""

    world_size = 1

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self

    def __getitem__(self, index):  # weight_bus_address()[0]
        return "address"


def _record_groups(monkeypatch, device: str) -> list[dict]:
    given: list[dict] = []

    def ray(worker_cls, pool, **kwargs):
        given.append(kwargs)
        return _Group()

    monkeypatch.setattr(layout.WorkerGroup, "ray", ray)
    monkeypatch.setattr(layout, "ResourcePool", lambda *args, **kwargs: None)
    monkeypatch.setattr(layout, "init_ray", lambda address=None: None)
    monkeypatch.setattr(layout, "resolve_device", lambda cfg: device)
    return given


@pytest.fixture
def controller_chose_bf16(monkeypatch):
    """A host where the controller's probe chooses bfloat16 (conftest pins float32 for everything else)."""
    monkeypatch.delenv(auto_dtype.ENV, raising=False)
    monkeypatch.setattr(auto_dtype, "_probe", lambda: torch.bfloat16)


def test_every_group_gets_the_choice_the_device_line_prints(tmp_path, monkeypatch, controller_chose_bf16):
    given = _record_groups(monkeypatch, "cpu")
    cfg = tiny_config(
        save_tiny(tmp_path / "policy"),
        1,
        "algorithm.adv_estimator=gae",
        "actor.fsdp.param_dtype=auto",
        "trainer.placement=separate",
        "rollout.layout=separate",
        "rollout.engine=hf",
    )
    assert "actor bf16 compute" in device_line(cfg, "cpu", "test")
    groups = layout.build_worker_groups(cfg)
    assert [kwargs["name"] for kwargs in given] == ["actor_ref", "rollout", "critic"]
    assert all(kwargs["env"] == {auto_dtype.ENV: "bfloat16"} for kwargs in given)
    assert groups.critic is not groups.actor


def test_a_pinned_choice_is_passed_on_and_a_gpu_run_passes_none(tmp_path, monkeypatch):
    monkeypatch.setenv(auto_dtype.ENV, "float32")
    assert auto_dtype.worker_env() == {auto_dtype.ENV: "float32"}
    given = _record_groups(monkeypatch, "cuda")
    layout.build_worker_groups(tiny_config(save_tiny(tmp_path / "policy"), 1, "rollout.engine=hf"))
    assert [kwargs["env"] for kwargs in given] == [None]
