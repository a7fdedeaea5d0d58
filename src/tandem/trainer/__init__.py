"""The controller's loops: the RL trainer (PPO, GRPO, DAPO, ...), the SFT trainer, checkpoints,
metrics and trackers. See tandem/trainer/ppo.py for one RL step, read top to bottom."""

from tandem.trainer.base import Trainer, run_dir
from tandem.trainer.checkpoint import CheckpointManager
from tandem.trainer.ppo import RLTrainer
from tandem.trainer.sft import SFTTrainer

__all__ = ["CheckpointManager", "RLTrainer", "SFTTrainer", "Trainer", "run_dir"]
