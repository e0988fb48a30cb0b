"""The failure predictor the control plane uses, loaded from the file that training wrote.

``manage.py train_failure_predictor`` trains the LSTM of ``runtime.recovery.predict`` (and the threshold
baseline beside it) on synthetic device histories and saves both, with their held-out evaluation, to
``POLYCHIP_FAILURE_PREDICTOR``. Until that file exists, no device is scored (the sweep says so once).
The file is re-read when it changes, so a retrained model takes effect without a restart.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from django.conf import settings

log = logging.getLogger(__name__)

_cache: dict[str, Any] = {}


def predictor_path() -> Path:
    return Path(settings.POLYCHIP_FAILURE_PREDICTOR)


def load_predictor() -> Any:
    """The trained ``LSTMPredictor``, or None when none has been trained yet."""
    path = predictor_path()
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        if not _cache.get("warned"):
            log.info("no failure predictor at %s: run manage.py train_failure_predictor to enable it", path)
            _cache["warned"] = True
        return None
    if _cache.get("key") != (str(path), mtime):
        import torch

        from runtime.recovery.predict import LSTMPredictor

        saved = torch.load(path, weights_only=True)
        _cache["model"] = LSTMPredictor.from_state(saved["predictor"])
        _cache["key"] = (str(path), mtime)
    return _cache["model"]


def save_predictor(result: dict[str, Any], path: Path | None = None) -> Path:
    """Save what ``runtime.recovery.predict.train_and_evaluate`` trained, atomically."""
    import torch

    path = path or predictor_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    models = result["models"]
    evaluation = {name: result[name].__dict__ for name in ("predictor", "baseline")}
    tmp = path.with_suffix(".tmp")
    torch.save(
        {"predictor": models["predictor"].state(), "baseline": models["baseline"].state(), "evaluation": evaluation},
        tmp,
    )
    tmp.replace(path)
    return path
