"""An unmodified PyTorch DDP script, as torchrun starts it (a job of kind ``torchrun``).

Nothing here knows Polychip: it reads torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, LOCAL_RANK), splits its data equally by rank, and keeps its own checkpoint in the folder
its arguments name. On Polychip that folder is ``$POLYCHIP_CHECKPOINT_DIR`` (the job's store, kept
across restarts), so a restarted job resumes from it; the split is equal and nothing is balanced.

    torchrun --nproc-per-node 2 train.py --steps 60 --checkpoint-dir /tmp/ckpt
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("POLYCHIP_CHECKPOINT_DIR", "checkpoints"))
    args = parser.parse_args()

    dist.init_process_group("gloo")  # env:// : RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpoint = Path(args.checkpoint_dir) / "ddp-example.pt"
    start = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        print(f"rank {rank}: resumed after step {start}", flush=True)

    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(world * args.batch * 8, 8, generator=data)
    labels = (inputs.sum(dim=1) > 0).long()
    for step in range(start + 1, args.steps + 1):
        window = (step * world + rank) * args.batch % len(inputs)
        x, y = inputs[window : window + args.batch], labels[window : window + args.batch]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]  # torch: no annotations
        optimizer.step()
        if rank == 0 and step % 20 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            torch.save(state, checkpoint)
    dist.destroy_process_group()
    if rank == 0:
        print("done", flush=True)


if __name__ == "__main__":
    main()
