"""Errors of the replay harness's admission, importable without the harness (the
sampling policy raises them, and the harness imports the policy)."""

from __future__ import annotations


class AdmissionError(ValueError):
    """A request outside the prepared contract (too long, bad sampling values)."""


class InvalidSampling(AdmissionError):
    """A sampling value that means nothing (Helios answers 400 naming ``field``)."""

    def __init__(self, field: str, reason: str, context: str = "") -> None:
        super().__init__(f"{context}{field} {reason}")
        self.field = field
        self.reason = reason
