"""Whole names in source text, found by a scan of the name's occurrences
instead of a pattern compiled per name (issue 11: the passes that look a
site's local up in a function's calls and returns compiled one pattern per
site, each used once). Every function answers exactly what the pattern in
its docstring answers (``\\w`` as in a ``str`` pattern: ``str.isalnum()``
or ``_``). Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _boundary(text: str, at: int) -> bool:
    """``\\b`` at offset ``at``."""
    before = at > 0 and _word(text[at - 1])
    after = at < len(text) and _word(text[at])
    return before != after


def has_word(text: str, name: str) -> bool:
    """``re.search(r"\\b" + re.escape(name) + r"\\b", text)``."""
    end = len(name)
    at = text.find(name)
    while at >= 0:
        if _boundary(text, at) and _boundary(text, at + end):
            return True
        at = text.find(name, at + 1)
    return False


def has_name(text: str, name: str, not_before: str = "", not_after: str = "") -> bool:
    """``(?<![\\w{not_before}])NAME(?![\\w{not_after}])``: ``name`` with no
    word character nor one of ``not_before`` just before it, and none nor
    one of ``not_after`` just after it."""
    end = len(name)
    at = text.find(name)
    while at >= 0:
        before = text[at - 1] if at > 0 else ""
        after = text[at + end] if at + end < len(text) else ""
        if not (before and (_word(before) or before in not_before)) and \
                not (after and (_word(after) or after in not_after)):
            return True
        at = text.find(name, at + 1)
    return False


def starts_with_word(text: str, name: str) -> bool:
    """``re.match(re.escape(name) + r"\\b", text)``."""
    return text.startswith(name) and _boundary(text, len(name))


IDENTIFIER = re.compile(r"[A-Za-z_]\w*")  # a Python or C++ name: one pattern for the passes that test or list names
SELF_MEMBER = re.compile(r"self\.([A-Za-z_]\w*)")  # `self.name` (the name its group): a member of the object

# `value_arguments`: a dotted name that starts a line or follows `,`/`(`/`=`, then blanks and `,`/`)`/the
# line's end: the maximal run of word characters and dots there, taken only when it is such a name
_VALUE_RUN = re.compile(r"[,(=\n][ \t]*([A-Za-z_][\w.]*)[ \t]*(?=[,)\n]|\Z)")
_DOTTED = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*")


def value_arguments(text: str) -> set[str]:
    """The last names of the values handed whole in call arguments (``text``: argument lists, one a
    line): ``set(re.findall(r"(?:^|[,(=])[ \\t]*(?:[A-Za-z_]\\w*\\.)*([A-Za-z_]\\w*)[ \\t]*(?=,|\\)|$)", text,
    re.M))``, searched from the characters that can start a match (perf-r29: a third less time than that
    pattern, whose first alternative is tried at every offset; tests/test_shared_patterns.py)."""
    return value_arguments_in((text,))


def value_arguments_in(texts: Iterable[str]) -> set[str]:
    """The union of ``value_arguments`` over ``texts``. A run's last name depends on the run alone, so
    the runs of all texts are gathered into one set first and each distinct run is read once (perf-r36b:
    flashinfer's files hand on 264,535 runs, 25,865 distinct)."""
    runs: set[str] = set()
    for text in texts:
        runs.update(_VALUE_RUN.findall("\n" + text))
    # a run without a dot is one name (``[A-Za-z_][\w.]*`` less the dots): ``_DOTTED`` matches it whole, and it is
    # its own last name; only dotted runs are checked and split (perf-r35b: a third less time after the findall)
    found = {run for run in runs if "." not in run}
    found.update([run.rpartition(".")[2] for run in runs if "." in run and _DOTTED.fullmatch(run)])
    return found
