import pytest
import torch

from tandem.engine import lm_head
from tandem.models.tiny import save_tiny

from . import lm_head_scenarios


@pytest.fixture(scope="session")
def lm_head_runs(tmp_path_factory):
    """lm_head_scenarios on 1 rank (tied and untied embeddings) and 2 ranks: spawned once, read by
    test_lm_head.py and test_attention.py."""
    root = tmp_path_factory.mktemp("lm_head")
    tied = save_tiny(root / "tied")
    untied = save_tiny(root / "untied", tie_word_embeddings=False)
    return {
        "one": lm_head_scenarios.run(1, tied, root / "one")[0],
        "two": lm_head_scenarios.run(2, tied, root / "two"),
        "untied": lm_head_scenarios.run(1, untied, root / "untied-one", sdpa_split=False)[0],
    }


@pytest.fixture
def compiles():
    """A fresh start for torch.compile (its recompile limit is per function and process: a test that hit it
    would run eager and compare eager with eager); yields a count of the graphs compiled since."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    lm_head._compiled.cache_clear()
    start = counters["stats"]["unique_graphs"]
    yield lambda: counters["stats"]["unique_graphs"] - start
    torch._dynamo.reset()
    lm_head._compiled.cache_clear()
