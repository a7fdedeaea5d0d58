"""Reward functions for the trainer tests (loaded as reward.custom_reward_file)."""


def by_length(data_source, solution_str, ground_truth, extra_info=None):
    """1 for an odd number of characters: samples of one prompt differ, whatever the model."""
    correct = len(solution_str) % 2 == 1
    return {"score": float(correct), "acc": correct}


def sometimes_raises(data_source, solution_str, ground_truth, extra_info=None):
    """Raises on responses of a length divisible by 3; else scores as by_length."""
    if len(solution_str) % 3 == 0:
        raise RuntimeError(f"this scorer fails on {len(solution_str)} characters")
    return by_length(data_source, solution_str, ground_truth, extra_info)


def constant(data_source, solution_str, ground_truth, extra_info=None):
    """0.5 for everything: every group scores alike, so dynamic sampling keeps none."""
    return {"score": 0.5, "acc": 0.5}


def by_characters(data_source, solution_str, ground_truth, extra_info=None):
    """A score in [0, 1) from the characters: different responses rarely tie (for grpo_passk's margin)."""
    return {"score": (sum(map(ord, solution_str)) % 97) / 97, "acc": False}


def by_parts(data_source, solution_str, ground_truth, extra_info=None):
    """Two reward terms for gdpo (algorithm.gdpo_reward_keys=[correct,format]), both varying within a group."""
    correct = len(solution_str) % 2 == 1
    form = (sum(map(ord, solution_str)) % 5) / 4
    return {"score": float(correct) + 0.5 * form, "correct": correct, "format": form}
