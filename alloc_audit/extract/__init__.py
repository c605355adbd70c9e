"""Stage 3, extract: a parsed file -> FileFacts (language-neutral facts).

Rules never see syntax trees; they read what these extractors record.
"""

from __future__ import annotations

from ..catalog import ApiCatalog
from ..model import FileFacts, Language
from ..parse import Parsed
from .cpp import extract_cpp
from .python import extract_python


def extract_facts(path: str, lang: Language, parsed: Parsed, apis: ApiCatalog) -> FileFacts:
    if lang is Language.PYTHON:
        return extract_python(path, parsed.source, parsed.tree, apis)
    return extract_cpp(path, lang, parsed.source, parsed.tree, apis, parsed.grammar)
