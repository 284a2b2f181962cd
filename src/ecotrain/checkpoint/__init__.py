"""Checkpoints: the safe format (safetensors + JSON), the whole state, atomic writes, resume."""

from ecotrain.checkpoint.format import load_state_dict_file, read_checkpoint, verify_checkpoint, write_checkpoint
from ecotrain.checkpoint.manager import CheckpointManager, latest_valid, list_checkpoints

__all__ = ["load_state_dict_file", "read_checkpoint", "verify_checkpoint", "write_checkpoint",
           "CheckpointManager", "latest_valid", "list_checkpoints"]
