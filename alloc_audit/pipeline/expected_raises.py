"""Stage 5, last before roles: an allocation a test expects to raise is no
site (issue 11, round 19).

``with pytest.raises(TypeError): model.cuda()`` (or ``self.assertRaises``,
``assertRaisesRegex``, ``pytest.raises`` with a ``match=``): when the call is
the last statement of the ``with`` body, either an earlier statement raised
(the call never runs) or the call itself raises, as the test expects; a
call that raises allocates nothing that outlives it. A call followed by
other statements in the body stays a site (it may run and succeed before
the one that raises). Direct and derived sites alike. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import Language, Site
from .index import ProjectIndex

_RAISES = frozenset({"raises", "assertRaises", "assertRaisesRegex", "assertRaisesRegexp"})


def drop_expected_raises(sites: Sequence[Site], index: ProjectIndex) -> list[Site]:
    return [s for s in sites if s.language is not Language.PYTHON or not _expected_to_raise(s, index)]


def _expected_to_raise(site: Site, index: ProjectIndex) -> bool:
    func = index.func(site.path, site.scope)
    if func is None or not func.withs:
        return False
    span = site.span
    for w in func.withs:
        if not any(item.callee.rsplit(".", 1)[-1] in _RAISES for item in w.items):
            continue
        if w.body.contains(span) and span.end_line == w.body.end_line:
            # an argument (or receiver) of the call that raises runs first: it allocates
            return not any(c.span != span and c.span.contains(span) for c in func.calls)
    return False
