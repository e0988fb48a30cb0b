"""Where the CLI finds its server and token: flags, then the environment, then ``polychip login``'s file.

    --url / POLYCHIP_URL      else the config file's, else http://127.0.0.1:$POLYCHIP_PORT (8000)
    --token / POLYCHIP_TOKEN  else the config file's, else the demo tenant's token file of a local checkout

The config file is ``$POLYCHIP_CONFIG``, or ``$XDG_CONFIG_HOME/polychip/config.json`` (``~/.config``):
readable by its owner alone (0600, in a folder of 0700), since it holds a secret.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from controlplane.cli import exitcodes
from controlplane.cli.errors import CliError

CHECKOUT_VAR = Path(__file__).resolve().parents[2] / "var"


def config_path() -> Path:
    explicit = os.environ.get("POLYCHIP_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "polychip" / "config.json"


def _stored() -> dict[str, str]:
    path = config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CliError(
            exitcodes.USAGE, f"cannot read {path} ({exc}); fix it, or remove it and `polychip login` again"
        ) from None
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def default_url() -> str:
    return f"http://127.0.0.1:{os.environ.get('POLYCHIP_PORT', '8000')}"


def _demo_token() -> str | None:
    var = Path(os.environ.get("POLYCHIP_VAR_DIR") or CHECKOUT_VAR)
    try:
        return (var / "demo-token").read_text().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None


def resolve(url: str | None, token: str | None) -> Target:
    """The server and token for this command (flags and the environment come in through click)."""
    stored = _stored() if not (url and token) else {}
    return Target(
        url=(url or stored.get("url") or default_url()).rstrip("/"),
        token=token or stored.get("token") or _demo_token(),
    )


def save(url: str, token: str) -> Path:
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        json.dump({"url": url, "token": token}, out)
    os.chmod(path, 0o600)  # an older file keeps its mode through O_CREAT: make it private now
    return path


def forget() -> bool:
    path = config_path()
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed
