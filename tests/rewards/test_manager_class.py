"""A reward-manager class of the user's, written against verl's interface (reward.manager_source=importlib): built
as verl builds it, called on a stand-in for verl's DataProto, its token-level rewards and extra info kept."""

import textwrap

import numpy as np
import pytest
import torch

from tandem.batch import Batch
from tandem.rewards import ManagerClassRewards, RewardManager
from tandem.rewards.terms import FormatTerm
from tandem.rewards.verl_manager import verl_data

PAD, EOS = 0, 1

MANAGERS = textwrap.dedent(
    '''
    from collections import defaultdict

    import torch


    class MarkerManager:
        """What a copy of verl's naive manager reads; every reward is its marker, on the last response token."""

        def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", marker=0.5):
            self.tokenizer, self.num_examine, self.compute_score = tokenizer, num_examine, compute_score
            self.reward_fn_key, self.marker = reward_fn_key, marker

        def __call__(self, data, return_dict=False):
            reward_tensor = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
            info = defaultdict(list)
            for i in range(len(data)):
                item = data[i]
                prompt_length = item.batch["prompts"].shape[-1]
                valid = int(item.batch["attention_mask"][prompt_length:].sum())
                text = self.tokenizer.decode(item.batch["responses"][:valid], skip_special_tokens=True)
                base = self.compute_score(
                    data_source=item.non_tensor_batch[self.reward_fn_key],
                    solution_str=text,
                    ground_truth=item.non_tensor_batch["reward_model"]["ground_truth"],
                    extra_info=item.non_tensor_batch.get("extra_info", {}),
                )
                reward_tensor[i, valid - 1] = self.marker
                info["base"].append(base["score"] if isinstance(base, dict) else base)
                info["text"].append(text)
                info["num_examine"].append(self.num_examine)
            data.batch["acc"] = torch.ones(len(data))  # verl's managers write to the batch: harmless here
            if return_dict:
                return {"reward_tensor": reward_tensor, "reward_extra_info": info}
            return reward_tensor


    class NoReturnDict:
        def __init__(self, tokenizer, num_examine, compute_score, reward_fn_key):
            pass

        def __call__(self, data):
            return torch.full(data.batch["responses"].shape, 0.25) * data.batch["response_mask"]


    class WrongShape(NoReturnDict):
        def __call__(self, data, return_dict=False):
            return torch.zeros(len(data))


    class Raises(NoReturnDict):
        def __call__(self, data, return_dict=False):
            return data.select(batch_keys=["responses"])


    class RewardManagerBase:  # the name of verl's reward-loop base class
        pass


    class LoopManager(RewardManagerBase):
        pass


    def compute_score(data_source, solution_str, ground_truth, extra_info=None, offset=0.0):
        return 10.0 + offset
    '''
)


class CharTokenizer:
    """One id per character; 0 = pad and 1 = eos are special."""

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i in (PAD, EOS)))

    def batch_decode(self, seqs, skip_special_tokens=False):
        return [self.decode(ids, skip_special_tokens) for ids in seqs]


def rollout_batch(prompts, texts, sources, ground_truths, width=6):
    """A rollout's output as Tandem's trainer scores it: left-padded prompts, right-padded responses (each with an
    EOS), the attention mask over both, and the rows' columns."""
    tok = CharTokenizer()
    p_width = max(len(p) for p in prompts)
    prompt_ids = torch.full((len(prompts), p_width), PAD)
    prompt_mask = torch.zeros(len(prompts), p_width, dtype=torch.long)
    responses = torch.full((len(texts), width), PAD)
    mask = torch.zeros(len(texts), width, dtype=torch.long)
    for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
        prompt_ids[i, p_width - len(prompt) :] = torch.tensor(tok.encode(prompt))
        prompt_mask[i, p_width - len(prompt) :] = 1
        row = [*tok.encode(text), EOS]
        responses[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    tensors = {
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": mask,
        "input_ids": torch.cat([prompt_ids, responses], 1),
        "attention_mask": torch.cat([prompt_mask, mask], 1),
    }
    columns = {
        "data_source": sources,
        "ground_truth": ground_truths,
        "extra_info": [{"index": i} for i in range(len(texts))],
        "uid": [f"u{i // 2}" for i in range(len(texts))],
    }
    return Batch.from_dict(tensors, columns)


ROWS = (["1+2=", "40+2="], ["3", "41"], ["addition", "addition"], ["3", "42"])


@pytest.fixture
def managers(tmp_path):
    path = tmp_path / "my_managers.py"
    path.write_text(MANAGERS)
    return str(path)


def test_the_classs_marker_reaches_the_token_level_rewards(managers):
    rewards = ManagerClassRewards(
        CharTokenizer(),
        manager_file=managers,
        manager_class="MarkerManager",
        manager_kwargs={"marker": 0.123},
    )
    result = rewards(rollout_batch(*ROWS))
    expected = torch.zeros(2, 6)
    expected[0, 1] = expected[1, 2] = 0.123  # the EOS after "3" and after "41"
    assert torch.allclose(result.token_level_scores, expected)
    assert torch.allclose(result.scores, torch.tensor([0.123, 0.123]))
    assert result.metrics["reward/error_count"] == 0 and result.metrics["reward/score_mean"] == pytest.approx(
        0.123
    )
    # compute_score without reward.custom_reward_file: Tandem's built-in scorer of the data_source (verl: its default)
    np.testing.assert_array_equal(result.extra["base"], [1.0, 0.0])
    assert list(result.extra["text"]) == ["3", "41"]
    np.testing.assert_array_equal(
        result.extra["num_examine"], [0, 0]
    )  # verl's training manager: num_examine=0


def test_reward_terms_are_added_on_the_last_token(managers):
    rewards = ManagerClassRewards(
        CharTokenizer(),
        manager_file=managers,
        manager_class="MarkerManager",
        terms=[FormatTerm("4", match_reward=1.0, mismatch_reward=0.0)],
    )
    result = rewards(rollout_batch(*ROWS))
    assert torch.allclose(result.scores, torch.tensor([0.5, 1.5]))
    assert result.token_level_scores[1, 2] == pytest.approx(1.5)


def test_compute_score_is_the_custom_function_with_its_kwargs_winning(managers):
    rewards = ManagerClassRewards(
        CharTokenizer(),
        manager_file=managers,
        manager_class="MarkerManager",
        custom_reward_file=managers,
        custom_reward_kwargs={"offset": 1.0},
    )
    np.testing.assert_array_equal(rewards(rollout_batch(*ROWS)).extra["base"], [11.0, 11.0])


def test_a_class_without_return_dict_is_called_again_without_it(managers):
    rewards = ManagerClassRewards(CharTokenizer(), manager_file=managers, manager_class="NoReturnDict")
    result = rewards(rollout_batch(*ROWS))
    assert torch.allclose(result.scores, torch.tensor([0.5, 0.75]))  # 0.25 on each response token


def test_the_stand_in_for_dataproto_has_verls_fields():
    data = verl_data(rollout_batch(*ROWS))
    assert len(data) == 2 and data.batch["attention_mask"].shape == (2, 11)
    assert data.non_tensor_batch["reward_model"][1] == {"ground_truth": "42"}
    assert data.non_tensor_batch["data_source"].dtype == object
    item = data[1]
    assert item.non_tensor_batch["extra_info"] == {"index": 1} and item.batch["responses"].shape == (6,)
    assert [row.non_tensor_batch["uid"] for row in data] == ["u0", "u0"]
    assert len(data[1:]) == 1 and data[[1]].non_tensor_batch["reward_model"][0]["ground_truth"] == "42"
    with pytest.raises(AttributeError, match="DataProto's 'union' is not there"):
        data.union(data)


def test_what_cannot_run_is_refused_naming_the_class(managers):
    with pytest.raises(TypeError, match=r"returned rewards of shape \(2,\)"):
        ManagerClassRewards(CharTokenizer(), manager_file=managers, manager_class="WrongShape")(
            rollout_batch(*ROWS)
        )
    with pytest.raises(
        RuntimeError, match="'Raises' in .* raised on a batch of 2: AttributeError: .*'select'"
    ):
        ManagerClassRewards(CharTokenizer(), manager_file=managers, manager_class="Raises")(
            rollout_batch(*ROWS)
        )
    with pytest.raises(TypeError, match="the module has no 'Missing'.*classes in it: .*MarkerManager"):
        ManagerClassRewards(CharTokenizer(), manager_file=managers, manager_class="Missing")
    with pytest.raises(TypeError, match="reward-loop managers"):
        ManagerClassRewards(CharTokenizer(), manager_file=managers, manager_class="LoopManager")
    with pytest.raises(TypeError, match=r"MarkerManager\(tokenizer=.*\*\*reward.manager_kwargs \['colour'\]"):
        ManagerClassRewards(
            CharTokenizer(),
            manager_file=managers,
            manager_class="MarkerManager",
            manager_kwargs={"colour": 1},
        )


def test_it_is_a_reward_manager_for_the_trainer(managers):
    rewards = ManagerClassRewards(CharTokenizer(), manager_file=managers, manager_class="MarkerManager")
    assert isinstance(rewards, RewardManager)
    rewards.check_data_sources([("no scorer has this", None)])  # the class decides: nothing to refuse
    assert list(rewards.ground_truth_problems([("addition", None, None)])) == []
