"""The answer type of tests/suspend_agent.py, importable by every process of the test."""

from __future__ import annotations

from pydantic import BaseModel


class Approval(BaseModel):
    approved: bool
    by: str
