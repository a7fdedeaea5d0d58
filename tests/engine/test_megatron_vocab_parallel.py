"""Log-probs and entropy from vocabulary-parallel logits (2 gloo ranks, each holding half the vocabulary)
equal algos.core's on the full logits, and so do their gradients (float32: asserted to 1e-5)."""

from __future__ import annotations

import uuid

import pytest
import torch

from tandem.algos.core import entropy_from_logits, log_probs_from_logits, sum_pi_squared_from_logits

from . import vocab_parallel_worker as w
from .ranks import start_ranks

pytest.importorskip("megatron.core")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("vocab_parallel")
    init_method = f"file://{out / f'store-{uuid.uuid4().hex}'}"
    start_ranks(w.worker, (2, init_method, str(out)), 2)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def test_log_probs_entropy_and_gradients_equal_the_full_vocabulary(ranks):
    logits, labels, w_lp, w_ent = w.inputs()
    full = logits.clone().requires_grad_(True)
    log_probs, entropy = log_probs_from_logits(full, labels), entropy_from_logits(full)
    ((log_probs * w_lp).sum() + (entropy * w_ent).sum()).backward()
    for rank in ranks:  # every rank has the whole rows' values
        torch.testing.assert_close(rank["log_probs"], log_probs.detach(), rtol=0, atol=1e-5)
        torch.testing.assert_close(rank["entropy"], entropy.detach(), rtol=0, atol=1e-5)
        torch.testing.assert_close(
            rank["sum_pi_squared"], sum_pi_squared_from_logits(logits), rtol=0, atol=1e-5
        )
    grad = torch.cat([rank["grad"] for rank in ranks], dim=-1)  # each rank: its own slice's gradient
    torch.testing.assert_close(grad, full.grad, rtol=0, atol=1e-5)
