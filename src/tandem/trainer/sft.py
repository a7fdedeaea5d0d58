"""The SFT trainer: supervised fine-tuning of the actor's model on (prompt, response) rows or
conversations (or the rows of a Dataset class of the user's, data.custom_dataset_file), on the same
workers and engine as RL, to warm-start a policy. Batch sizes: data.train_batch_size ROWS per
optimizer step, split over the ranks, actor.micro_batch_size_per_rank rows per forward/backward.
At the end the model is exported as a Hugging Face folder, `<run dir>/hf_model`, ready to be an
RL run's actor.model_path."""

from __future__ import annotations

import logging
import math
import time

from tandem.config.errors import ConfigError
from tandem.config.schema import TandemConfig
from tandem.config.validate import validate_config
from tandem.data import SFTDataset, collate_sft
from tandem.data.user_sft_dataset import UserSFTRows, sft_dataset_config
from tandem.rollout.agent import tool_schemas
from tandem.rollout.base import read_special_ids
from tandem.run_folder import DUMP_KINDS, SFT_MODEL_DIR
from tandem.trainer.base import Trainer
from tandem.trainer.start_checks.model_folders import check_model_folders
from tandem.trainer.start_checks.tokenizers import (
    check_tokenizers,
    load_actor_tokenizer,
    load_image_processor,
)

SFT_TRUNCATION = ("error", "right")

logger = logging.getLogger(__name__)


class SFTTrainer(Trainer):
    """Reads and checks the SFT rows; `fit()` trains the actor's model on them and exports it to
    `<run dir>/hf_model`."""

    purpose = "sft"
    console_keys = ("sft/loss", "val/loss", "sft/grad_norm", "sft/lr", "timing_s/step")

    def __init__(self, cfg: TandemConfig) -> None:
        validate_config(cfg, require_data=True)
        d = cfg.data
        if d.truncation not in SFT_TRUNCATION:
            raise ConfigError(
                f"data.truncation={d.truncation} is for RL prompts; SFT takes error or right "
                "(set data.truncation=error or right)"
            )
        check_model_folders(cfg, "sft")
        if d.sampler_file:  # RL training's (tandem train): never silently dropped
            raise ConfigError(
                f"data.sampler_file={d.sampler_file} is read by RL training (tandem train); tandem sft trains on the "
                "rows of data.train_files in the order of data.shuffle and data.seed. Remove it"
            )
        for key in DUMP_KINDS.values():
            if getattr(cfg.trainer, key):
                logger.warning(
                    "trainer.%s has no effect in tandem sft: SFT trains on the dataset's responses and generates "
                    "none, so there are no samples to write (its loss curves are in metrics.jsonl, `tandem view`)",
                    key,
                )
        self.tokenizer = load_actor_tokenizer(cfg)
        self.processor = load_image_processor(cfg)  # a vision-language model's: its rows may carry images
        self.train_data = self._rows(d.train_files, cfg, "data.train_files")
        self.val_data = self._rows(d.val_files, cfg, "data.val_files") if d.val_files else None
        check_tokenizers(cfg, self.tokenizer, [self.train_data, self.val_data], "sft")
        super().__init__(cfg, len(self.train_data), d.train_batch_size)
        self.hf_dir = self.run_dir / SFT_MODEL_DIR

    def _rows(self, files: list[str], cfg: TandemConfig, key: str) -> SFTDataset | UserSFTRows:
        d = cfg.data
        max_length = d.max_length or d.max_prompt_length + d.max_response_length
        if d.custom_dataset_file:  # the rows of a Dataset class of the user's (verl's data.custom_cls)
            return UserSFTRows(
                d.custom_dataset_file,
                d.custom_dataset_class,
                files,
                tokenizer=self.tokenizer,
                processor=self.processor,
                config=sft_dataset_config(d, max_length),
                files_key=key,
                max_length=max_length,
                truncation=d.truncation,
            )
        return SFTDataset(
            files,
            self.tokenizer,
            max_length=max_length,
            prompt_key=d.prompt_key,
            response_key=d.response_key,
            prompt_dict_keys=d.prompt_dict_keys,
            response_dict_keys=d.response_dict_keys,
            messages_key=d.messages_key,
            truncation=d.truncation,
            chat_template=d.chat_template,
            chat_template_kwargs=d.chat_template_kwargs,
            tools=tool_schemas(cfg.rollout.multi_turn),
            stop_token_ids=read_special_ids(cfg.actor.model_path, cfg.actor.tokenizer_path, self.tokenizer)[
                0
            ],
            processor=self.processor,
            image_key=d.image_key,
            loss_mask=d.sft_loss_mask,
        )

    def train_step(self) -> dict[str, float]:
        start = time.perf_counter()
        batch = collate_sft([self.train_data[i] for i in self.next_indices()], self.tokenizer.pad_token_id)
        metrics = self.groups.actor.sft_step(batch)[0]
        metrics["timing_s/step"] = time.perf_counter() - start
        return metrics

    def has_validation(self) -> bool:
        return self.val_data is not None

    def validate(self) -> dict[str, float]:
        """Token-mean negative log-likelihood of the validation responses (`val/loss`), and the share of
        responses whose every token the model gives a probability above 1/2 (`val/sure_match`: greedy
        decoding reproduces at least that share of the rows exactly)."""
        data = self.val_data
        size = self.cfg.data.val_batch_size or len(data)
        nll = tokens = sure = 0.0
        for start in range(0, len(data), size):
            rows = [data[i] for i in range(start, min(start + size, len(data)))]
            out = self.groups.actor.sft_nll(collate_sft(rows, self.tokenizer.pad_token_id))
            nll, tokens = nll + float(out["nll_sum"].sum()), tokens + float(out["num_tokens"].sum())
            sure += float((out["min_log_prob"] > -math.log(2.0)).sum())
        return {"val/loss": nll / max(tokens, 1.0), "val/sure_match": sure / len(data)}

    def finish(self) -> None:
        self.groups.actor.export_hf("actor", str(self.hf_dir))
        print(f"[tandem] SFT model exported to {self.hf_dir}", flush=True)
