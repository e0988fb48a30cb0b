"""The final model of a run: rank 0 writes the model's ``state_dict`` to ``<artifacts_dir>/model.pt``."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

ARTIFACT_NAME = "model.pt"


def save_model(model: nn.Module, artifacts_dir: str | Path) -> Path:
    """Write the state_dict atomically: a reader sees the old file or the whole new one, never half."""
    folder = Path(artifacts_dir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / ARTIFACT_NAME
    tmp = folder / f".{ARTIFACT_NAME}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as fh:
            torch.save(model.state_dict(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return final
