"""The one error for an unusable run directory."""

from __future__ import annotations


class RunDirError(ValueError):
    """A path is not a usable run directory (missing, incomplete, malformed, or one that must
    not be overwritten); the message says which file and why."""
