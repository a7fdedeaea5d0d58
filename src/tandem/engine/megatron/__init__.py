"""The megatron-core engine (tensor, pipeline and data parallel). Importing this package does not import
megatron-core; constructing a `MegatronEngine` does."""

from tandem.engine.megatron.engine import MegatronEngine
from tandem.engine.megatron.parallel import megatron_available

__all__ = ["MegatronEngine", "megatron_available"]
