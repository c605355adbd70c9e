"""Allowlist keys: a site's identity without line numbers.

A key is ``path scope api``: moving code, reformatting, editing arguments or
adding lines above a site changes nothing; a second site of the same api in
the same scope has the same key and raises the entry's count. Fields are
separated by single spaces; a space, ``#``, ``%`` or a control character inside
a field is percent-encoded (C++ scopes such as ``operator new`` are the only
real case), so a key is always three tokens and round-trips exactly.
"""

from __future__ import annotations

from ..model import Site, key_text
from ..model import escape_key_field as escape

__all__ = ["escape", "key_text", "parse_key", "site_key", "unescape"]


def unescape(field: str) -> str:
    """The inverse of :func:`escape` (percent sequences are UTF-8 bytes)."""
    if "%" not in field:
        return field
    from urllib.parse import unquote

    return unquote(field, errors="strict")


def site_key(site: Site) -> tuple[str, str, str]:
    return (site.path, site.scope, site.api)


def parse_key(text: str) -> tuple[str, str, str] | None:
    parts = text.split()
    if len(parts) != 3:
        return None
    return (unescape(parts[0]), unescape(parts[1]), unescape(parts[2]))
