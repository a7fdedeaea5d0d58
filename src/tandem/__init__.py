"""Tandem: reinforcement-learning post-training for large language models."""

__version__ = "0.1.0"
