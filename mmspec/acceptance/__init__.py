"""Acceptance rules: one per file, each a pure tensor function behind ``Rule``'s contract."""

from .base import Rule
from .exact import Exact, Greedy

__all__ = ["Rule", "Exact", "Greedy"]
