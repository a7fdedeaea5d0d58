import hashlib
import json
import logging
import random

import numpy as np
import pytest
import torch

from tandem.trainer.checkpoint import (
    COMPLETE,
    LATEST_ITERATION,
    MANIFEST,
    TRAINER_STATE,
    CheckpointError,
    CheckpointManager,
    checkpoint_step,
    load_trainer_state,
    save_trainer_state,
    verify,
)


def write(manager, step, crash=False):
    with manager.writing(step) as folder:
        (folder / "actor").mkdir()
        (folder / "actor" / "shard").write_text(f"weights of step {step}")
        save_trainer_state(folder, {"step": step})
        if crash:
            raise KeyboardInterrupt  # killed mid-write


def test_newest_complete_checkpoint_wins_and_old_ones_are_pruned(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    assert manager.latest() is None and manager.resolve("auto") is None
    for step in (2, 4, 6):
        write(manager, step)
    assert [s for s, _ in manager.checkpoints()] == [4, 6]
    assert manager.resolve("auto") == tmp_path / "global_step_6"
    assert manager.resolve("disable") is None
    assert manager.resolve(str(tmp_path / "global_step_4")) == tmp_path / "global_step_4"


def test_a_crash_mid_write_leaves_the_last_good_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path, keep=1)
    write(manager, 2)
    with pytest.raises(KeyboardInterrupt):
        write(manager, 4, crash=True)
    assert manager.latest() == tmp_path / "global_step_2"
    assert (tmp_path / "global_step_2" / "actor" / "shard").read_text() == "weights of step 2"
    assert not list(tmp_path.glob(".partial-*"))  # removed on the way out


def test_leftovers_of_a_killed_process_are_never_read_and_get_removed(tmp_path):
    manager = CheckpointManager(tmp_path)
    write(manager, 2)
    leftover = tmp_path / ".partial-global_step_4"
    leftover.mkdir()
    (leftover / COMPLETE).write_text("4")  # even with the marker, a partial name is not a checkpoint
    incomplete = tmp_path / "global_step_6"  # a folder without the marker (e.g. copied by hand, cut short)
    incomplete.mkdir()
    assert manager.latest() == tmp_path / "global_step_2"
    manager.remove_partial()
    assert not leftover.exists()


def test_resume_from_a_folder_that_is_not_a_checkpoint_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a complete Tandem checkpoint"):
        CheckpointManager(tmp_path).resolve(str(tmp_path))
    with pytest.raises(ValueError, match="max_checkpoints_to_keep"):
        CheckpointManager(tmp_path, keep=0)


def test_rewriting_a_step_replaces_it(tmp_path):
    manager = CheckpointManager(tmp_path)
    write(manager, 2)
    with manager.writing(2) as folder:
        save_trainer_state(folder, {"step": 2, "note": "second"})
    assert load_trainer_state(manager.latest())["note"] == "second"


def test_trainer_state_restores_the_rng_streams(tmp_path):
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    save_trainer_state(tmp_path, {"step": 7})
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    assert load_trainer_state(tmp_path) == {"step": 7}
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


# ---- manifests: a damaged checkpoint is found before anything loads it ------------------------------


def test_the_manifest_lists_every_file_with_its_size_and_small_ones_with_a_checksum(tmp_path):
    manager = CheckpointManager(tmp_path)
    write(manager, 2)
    manifest = json.loads((tmp_path / "global_step_2" / MANIFEST).read_text())["files"]
    assert set(manifest) == {"actor/shard", TRAINER_STATE}
    assert manifest["actor/shard"] == {
        "size": len(b"weights of step 2"),
        "sha256": hashlib.sha256(b"weights of step 2").hexdigest(),
    }
    assert verify(tmp_path / "global_step_2") == []


def test_resume_auto_falls_back_past_a_damaged_newest_checkpoint_and_says_why(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    for step in (2, 4, 6):
        write(manager, step)
    (tmp_path / "global_step_6" / "actor" / "shard").unlink()  # a shard lost after COMPLETE was written
    (tmp_path / "global_step_4" / "actor" / "shard").write_text("cut")  # a short file
    with caplog.at_level(logging.WARNING):
        assert manager.resolve("auto") == tmp_path / "global_step_2"
    assert "global_step_6 is damaged (actor/shard is missing)" in caplog.text
    assert "global_step_4 is damaged (actor/shard has 3 bytes, the manifest says 17)" in caplog.text


def test_a_same_size_change_fails_the_checksum(tmp_path):
    manager = CheckpointManager(tmp_path)
    write(manager, 2)
    (tmp_path / "global_step_2" / "actor" / "shard").write_text("weights of step X")
    assert verify(tmp_path / "global_step_2") == ["actor/shard does not match its checksum"]


def test_a_damaged_checkpoint_named_explicitly_is_an_error_naming_the_file(tmp_path):
    manager = CheckpointManager(tmp_path)
    write(manager, 2)
    write(manager, 4)
    (tmp_path / "global_step_4" / "actor" / "shard").unlink()
    with pytest.raises(CheckpointError, match=r"global_step_4 is damaged: actor/shard is missing"):
        manager.resolve(str(tmp_path / "global_step_4"))
    assert manager.resolve(str(tmp_path / "global_step_2")) == tmp_path / "global_step_2"


def test_when_every_checkpoint_is_damaged_resume_auto_refuses_to_start_afresh_silently(tmp_path):
    manager = CheckpointManager(tmp_path)
    write(manager, 2)
    (tmp_path / "global_step_2" / TRAINER_STATE).unlink()
    with pytest.raises(CheckpointError, match="every checkpoint under .* is damaged.*trainer.resume=disable"):
        manager.resolve("auto")


def test_a_checkpoint_from_before_manifests_still_loads(tmp_path):
    manager = CheckpointManager(tmp_path)
    write(manager, 2)
    (tmp_path / "global_step_2" / MANIFEST).unlink()
    assert manager.resolve("auto") == tmp_path / "global_step_2"
    assert checkpoint_step(tmp_path / "global_step_2") == 2


# ---- verl's latest_checkpointed_iteration.txt beside the global_step_N folders ---------------------------


def latest_iteration(root) -> str:
    return (root / LATEST_ITERATION).read_text()


def test_the_iteration_file_names_the_newest_checkpoint_after_saves_and_deletions(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    write(manager, 2)
    assert latest_iteration(tmp_path) == "2"  # the step alone, as verl writes it
    for step in (4, 6):
        write(manager, step)
    assert [s for s, _ in manager.checkpoints()] == [4, 6] and latest_iteration(tmp_path) == "6"
    with pytest.raises(KeyboardInterrupt):
        write(manager, 8, crash=True)
    assert latest_iteration(tmp_path) == "6"  # a write that never finished changes nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_4", "global_step_6", LATEST_ITERATION]


def test_the_iteration_file_follows_resume_auto_past_a_damaged_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path)
    for step in (2, 4):
        write(manager, step)
    (tmp_path / "global_step_4" / "actor" / "shard").unlink()
    assert manager.resolve("auto") == tmp_path / "global_step_2" and latest_iteration(tmp_path) == "2"
    # the resumed run saves step 3: the damaged step 4 is not the latest
    write(manager, 3)
    assert latest_iteration(tmp_path) == "3"
    write(manager, 4)  # and replaces it
    assert latest_iteration(tmp_path) == "4"


def test_a_newer_intact_checkpoint_stays_the_latest_after_an_older_one_is_saved(tmp_path):
    manager = CheckpointManager(tmp_path)
    write(manager, 6)
    write(manager, 2)  # resumed explicitly from an older checkpoint (trainer.resume=PATH)
    assert latest_iteration(tmp_path) == "6" and manager.resolve("auto") == tmp_path / "global_step_6"


def test_a_stale_iteration_file_is_removed_when_no_checkpoint_is_left_and_a_partial_one_is_cleaned(tmp_path):
    manager = CheckpointManager(tmp_path)
    (tmp_path / LATEST_ITERATION).write_text("9")  # its checkpoints deleted by hand
    (tmp_path / f".partial-{LATEST_ITERATION}").write_text("1")  # a write killed before its rename
    manager.remove_partial()
    assert manager.resolve("auto") is None
    assert list(tmp_path.iterdir()) == []
