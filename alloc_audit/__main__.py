"""``python -m alloc_audit``."""

from .cli import entry

entry()
