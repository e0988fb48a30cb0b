"""A user's training script on Polychip's training API (a job of kind ``python``).

It trains a small classifier on data it makes from its seed (nothing to download), with a learning
rate scheduler and a data iterator whose position is checkpointed: after a restart on other chips the
job goes on from the step after its last checkpoint, with the same data order and the same schedule.

Try it alone first (one process, the defaults below)::

    python train.py

then pack it and run it on Polychip (see runtime/sdk/README.md)::

    tar czf code.tar.gz train.py
    curl -H "Authorization: Bearer $TOKEN" --data-binary @code.tar.gz \\
         -H "Content-Type: application/gzip" http://127.0.0.1:8000/api/v1/bundles
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime import sdk

FEATURES, CLASSES, SAMPLES = 16, 4, 2048


class ShuffledBatches:
    """Global batches in a seeded order, a new order each epoch. Every rank holds the same iterator
    (the context gives each rank its own slice of the batch); its position is checkpointed."""

    def __init__(self, seed: int, global_batch: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        teacher = torch.randn(FEATURES, CLASSES, generator=generator)
        self.inputs = torch.randn(SAMPLES, FEATURES, generator=generator)
        self.labels = (self.inputs @ teacher).argmax(dim=1)
        self.seed, self.global_batch = seed, global_batch
        self.position = 0  # global batches handed out so far

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        per_epoch = SAMPLES // self.global_batch
        epoch, index = divmod(self.position, per_epoch)
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(self.seed * 1000 + epoch))
        chosen = order[index * self.global_batch : (index + 1) * self.global_batch]
        self.position += 1
        return self.inputs[chosen], self.labels[chosen]

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def main() -> None:
    with sdk.init(steps=120, global_batch=64, lr=0.05, seed=0) as ctx:
        workload = ctx.workload  # the job's spec: steps, global_batch, lr, seed
        torch.manual_seed(workload.seed)  # the same initial weights on every rank
        model = nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, CLASSES))
        optimizer = torch.optim.SGD(model.parameters(), lr=workload.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
        data = ShuffledBatches(workload.seed, workload.global_batch)
        start = ctx.prepare(model, optimizer, scheduler=scheduler, data=data)
        if start > 1:
            print(f"resumed at step {start} (data position {data.position})", flush=True)
        for step in ctx.steps():
            inputs, labels = data.next_batch()
            for lo, hi in ctx.slices():  # this rank's share of the global batch
                ctx.backward(F.cross_entropy(model(inputs[lo:hi]), labels[lo:hi], reduction="sum"))
            loss = ctx.step()  # gradients exchanged, optimizer stepped, the same on every rank
            scheduler.step()
            ctx.report(lr=scheduler.get_last_lr()[0])
            if step % 20 == 0 or step == ctx.total_steps:
                with torch.no_grad():
                    accuracy = (model(data.inputs).argmax(dim=1) == data.labels).float().mean().item()
                ctx.report(accuracy=accuracy)
                print(f"step {step}: loss {loss:.4f} accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
