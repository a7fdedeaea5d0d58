"""verl's data.sampler.class_path / class_name read as Tandem's data.sampler_file / data.sampler_class, and the
start-up checks of the pair (the class itself: tests/data/test_user_sampler.py)."""

from __future__ import annotations

import pytest

from tandem.config import load_config
from tandem.config.errors import ConfigError


def _cfg(*overrides: str):
    return load_config("grpo", list(overrides), on_verl=lambda t: None)


def test_verls_keys_name_the_file_and_the_class(tmp_path):
    path = tmp_path / "curriculum.py"
    path.write_text("class Curriculum:\n    pass\n")
    cfg = _cfg(f"data.sampler.class_path={path}", "data.sampler.class_name=Curriculum")
    assert (cfg.data.sampler_file, cfg.data.sampler_class) == (str(path), "Curriculum")
    # verl's pkg://package.module: imported by name when the run starts, not checked as a file
    pkg = _cfg("data.sampler.class_path=pkg://tests.utils.dataset.samplers", "data.sampler.class_name=S")
    assert pkg.data.sampler_file == "pkg://tests.utils.dataset.samplers"
    # verl's dataloader_num_workers=0 (which verl asks of a curriculum) and its default are both accepted
    assert _cfg(
        f"data.sampler.class_path={path}", "data.sampler.class_name=C", "data.dataloader_num_workers=0"
    )


def test_one_without_the_other_and_a_missing_file_are_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"data.sampler_class=C needs data.sampler_file, the Python file"):
        _cfg("data.sampler_class=C")
    with pytest.raises(
        ConfigError, match=r"data.sampler_file=.*needs data.sampler_class, the name of the sampler"
    ):
        _cfg(f"data.sampler.class_path={tmp_path / 'c.py'}")
    with pytest.raises(ConfigError, match=r"data.sampler_file: '.*nowhere.py' does not exist"):
        _cfg(f"data.sampler_file={tmp_path / 'nowhere.py'}", "data.sampler_class=C")
