from pathlib import Path

import pytest

from tandem.models.tiny import build_tokenizer, save_tiny

from .data_helpers import SMALL_MODEL


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model", padding_side="left", **SMALL_MODEL)
