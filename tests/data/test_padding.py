import torch

from tandem.batch import Batch
from tandem.data.padding import concat_left_padded


def test_rollout_batches_concatenate_with_their_prompt_side_left_padded_to_the_widest():
    narrow = Batch.from_dict(
        {
            "prompts": torch.tensor([[5, 6]]),
            "input_ids": torch.tensor([[5, 6, 7]]),
            "attention_mask": torch.tensor([[1, 1, 1]]),
            "position_ids": torch.tensor([[0, 1, 2]]),
            "responses": torch.tensor([[7]]),
        }
    )
    wide = Batch.from_dict(
        {
            "prompts": torch.tensor([[1, 2, 3]]),
            "input_ids": torch.tensor([[1, 2, 3, 4]]),
            "attention_mask": torch.tensor([[1, 1, 1, 1]]),
            "position_ids": torch.tensor([[0, 1, 2, 3]]),
            "responses": torch.tensor([[4]]),
        }
    )
    both = concat_left_padded([narrow, wide], pad_id=9)
    assert both["prompts"].tolist() == [[9, 5, 6], [1, 2, 3]]
    assert both["input_ids"].tolist() == [[9, 5, 6, 7], [1, 2, 3, 4]]
    assert both["attention_mask"].tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    assert both["position_ids"].tolist() == [[0, 0, 1, 2], [0, 1, 2, 3]]
    assert both["responses"].tolist() == [[7], [4]]  # the response side is not touched
    assert narrow["prompts"].tolist() == [[5, 6]]  # the inputs are not changed


def test_a_batch_without_some_prompt_side_columns_pads_those_it_has():
    small = Batch.from_dict({"prompts": torch.tensor([[5]]), "attention_mask": torch.tensor([[1, 1]])})
    big = Batch.from_dict({"prompts": torch.tensor([[1, 2]]), "attention_mask": torch.tensor([[1, 1, 1]])})
    both = concat_left_padded([small, big], pad_id=0)
    assert both["prompts"].tolist() == [[0, 5], [1, 2]]
    assert both["attention_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
