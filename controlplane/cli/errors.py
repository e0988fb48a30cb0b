"""The one error the CLI shows: a line that says what went wrong and how to fix it, and an exit code."""

from __future__ import annotations


class CliError(Exception):
    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message
