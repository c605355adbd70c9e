"""Stage 3, extract: a parsed file -> FileFacts (language-neutral facts).

Rules never see syntax trees; they read what these extractors record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...model import FileFacts, Language

if TYPE_CHECKING:
    from ...catalog import ApiCatalog
    from ..parse import Parsed


def extract_facts(path: str, lang: Language, parsed: Parsed, apis: ApiCatalog) -> FileFacts:
    # imported here: a warm run (everything cached) never loads the extractors
    if lang is Language.PYTHON:
        from .python import extract_python

        return extract_python(path, parsed.source, parsed.tree, apis)
    from .cpp import extract_cpp

    return extract_cpp(path, lang, parsed.source, parsed.tree, apis, parsed.grammar)
