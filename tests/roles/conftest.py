"""Fixtures of the role tests that build FSDP2 engines in this process."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from tandem.models.tiny import save_tiny


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A world-size-1 gloo group for engines built in this process (left alone if one exists)."""
    created = not dist.is_initialized()
    if created:
        store = tmp_path_factory.mktemp("store") / "rendezvous"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"lm": save_tiny(root / "policy"), "value": save_tiny(root / "critic", num_labels=1)}
