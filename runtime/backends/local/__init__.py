"""The local backend: one OS process per device, gloo over loopback, device speed emulated."""

from runtime.backends.local.backend import LocalBackend, find_free_port

__all__ = ["LocalBackend", "find_free_port"]
