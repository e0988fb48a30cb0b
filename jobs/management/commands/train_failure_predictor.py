"""``manage.py train_failure_predictor [--quick] [--seed N]``: train the device failure predictor.

Trains the LSTM and the threshold baseline of ``runtime.recovery.predict`` on synthetic device
histories (no real failure data exists here, and the figures say so), prints both held-out
evaluations, and saves the models to ``POLYCHIP_FAILURE_PREDICTOR`` for the control plane's sweep.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Train the device failure predictor (LSTM) and its threshold baseline; save them for the sweep."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--quick", action="store_true", help="fewer histories and epochs (seconds, not minutes)")
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args: Any, **options: Any) -> None:
        import torch

        from jobs.predictor import save_predictor
        from runtime.recovery.predict import summary, train_and_evaluate

        torch.set_num_threads(1)  # faster than two on this size of model, and kinder to neighbours
        result = train_and_evaluate(seed=options["seed"], quick=options["quick"])
        self.stdout.write(summary(result))
        path = save_predictor(result)
        self.stdout.write(self.style.SUCCESS(f"saved to {path}"))
