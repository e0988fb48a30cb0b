"""The embedded broker: kombu's filesystem transport, with messages written atomically.

kombu writes each message file in place, under its final name, while consumers poll the folder
and move away whatever they find. A consumer can take a file that is still empty and fail on it
(JSONDecodeError), which stops the worker's consumer for good. Here a message is written under a
name that consumers skip and renamed into place when complete; a rename is atomic.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    # kombu's two base classes disagree on the name of the second argument; this follows the nearer one.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # Same name as kombu's own (time first, so consumers take messages in order).
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = f"{final}.partial"  # consumers only take names ending in '.<queue>.msg'
        try:
            with open(partial, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
