"""Stage 3, extract (Python): whether a ``.to(device)`` / ``.cuda()`` moves a
whole ``nn.Module`` (a weight upload) rather than a tensor (a copy).

The receiver, through dtype and mode casts (``model.half().cuda()``), is a
module when it is, or is a local last assigned in the same function from, a
call of ``torch.nn.<Class>``, of ``*.from_pretrained``, or of a class this
file defines on a base named ``*Module``. Anything else (a class from another
file, a parameter, an attribute) stays a tensor copy: unknown is not a
module. Pure.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .python import PythonExtractor

# casts and moves that return what they are called on, a module for a module
# and a tensor for a tensor (`model.half().cuda()`, `embed.to(dtype).to(device)`)
_CASTS = re.compile(r"\.(?:(?:half|float|bfloat16|double|eval|train|requires_grad_|cpu|cuda)\(\s*(?:True|False)?\s*\)"
                    r"|(?:to|cuda)\([^()]*\))$")
_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_NN_CLASS = re.compile(r"torch\.nn\.(?:modules\.\w+\.)?[A-Z]\w*$")
_NOT_MODULES = frozenset({"Parameter", "ParameterList", "ParameterDict", "UninitializedParameter"})


def moves_module(ext: PythonExtractor, node: Any) -> bool:
    """Whether the method call ``node`` (``x.to(...)``, ``x.cuda()``) is on
    an ``nn.Module`` instance."""
    fn = node.children[0]
    receiver = fn.child_by_field_name("object") if fn.type == "attribute" else None
    if receiver is None:
        return False
    text = ext.src.text(receiver, 400).strip()
    while (m := _CASTS.search(text)) is not None:
        text = text[:m.start()].strip()
    before = node.start_byte
    for _hop in range(3):  # `m = m.to(dtype)` follows m to the assignment above
        if not text.isidentifier():
            break
        found = _last_assignment(ext, node, text, before)
        if found is None:
            return False
        text, before = found
    return _builds_module(ext, text)


def _builds_module(ext: PythonExtractor, text: str) -> bool:
    m = _CALL.match(text)
    if m is None or not text.rstrip().endswith(")"):
        return False
    callee = ext.resolve_text(m.group(1))
    leaf = callee.rsplit(".", 1)[-1]
    if leaf == "from_pretrained":
        return True
    if _NN_CLASS.match(callee) and leaf not in _NOT_MODULES:
        return True
    if callee.startswith("transformers.") and leaf[:1].isupper():
        return True  # a transformers class with .to/.cuda: a model (configs and tokenizers have neither)
    if "." in callee:
        return False
    found = re.search(rb"^[ \t]*class[ \t]+" + re.escape(callee.encode()) + rb"[ \t]*\(([^)]*)\)",
                      ext.src.data, re.M)
    if found is None:
        return False
    bases = [b.strip() for b in found.group(1).decode("utf-8", "replace").split(",")]
    return any(re.fullmatch(r"(?:[\w.]+\.)?\w*Module", b) is not None for b in bases)


def _last_assignment(ext: PythonExtractor, node: Any, name: str, before: int) -> tuple[str, int] | None:
    """The right-hand side of the last plain ``name = ...`` above ``before``
    in ``node``'s function (one line, casts stripped) and where it starts, or
    None."""
    body = node.parent
    while body is not None and body.type not in ("function_definition", "module"):
        body = body.parent
    if body is None:
        return None
    text = ext.src.data[body.start_byte:before].decode("utf-8", "replace")
    text = text[:text.rfind("\n") + 1]  # whole lines only: not the statement `before` is in
    pattern = rf"^[ \t]*{re.escape(name)}[ \t]*(?::[^=\n]*)?=(?!=)[ \t]*([^\n]+)$"
    found: re.Match[str] | None = None
    for hit in re.finditer(pattern, text, re.M):
        found = hit
    if found is None:
        return None
    value = found.group(1).strip()
    while (m := _CASTS.search(value)) is not None:
        value = value[:m.start()].strip()
    return value, body.start_byte + len(text[:found.start()].encode("utf-8"))
