"""Errors raised by the analysis layer for unusable input."""

from __future__ import annotations


class RunDirError(ValueError):
    """A path is not a usable run directory (missing, incomplete, or malformed); the message says which file and why."""
