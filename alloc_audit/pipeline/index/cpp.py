"""C++/CUDA call resolution: free functions (preferring the caller's
namespace, then its file), ``ns::f``, ``Cls::m``, constructions, ``this->m``,
``ptr->m()``/``ref.m()`` through member, parameter and local types; and, for
a call that does not resolve, the class or function names whose definition
could resolve it."""

from __future__ import annotations

import re

from ..names import IDENTIFIER
from .symbols import ClassInfo, Func, Symbols, split_callee
from .types import Types

# Names that are never the project's own: CUDA/driver/NCCL APIs, casts, std.
_CPP_EXTERNAL = re.compile(r"^(?:cuda|cu[A-Z]|nccl|nvml|cublas|cudnn|curand|cusparse|std$|dim3$|\w+_cast$|"
                           r"make_(?:unique|shared|pair|tuple)$|printf$|fprintf$|memset$|memcpy$|malloc$|free$)")
_MACRO_LIKE = re.compile(r"[A-Z][A-Z0-9_]*")


class CppResolution:
    def __init__(self, symbols: Symbols, types: Types) -> None:
        self._symbols = symbols
        self._types = types

    def resolve(self, func: Func, callee: str) -> list[Func]:
        symbols = self._symbols
        receiver, name = split_callee(callee)
        if not receiver:
            if func.owner is not None:
                found = symbols.method_lookup(func.owner, name)
                if found:
                    return found
            cls = symbols.cpp_class(name)
            if cls is not None:
                return symbols.constructors(cls)
            return self._free_function(func, name)
        if "::" in callee and "." not in callee and "->" not in callee:
            cls = symbols.cpp_class(callee)
            if cls is not None:
                return symbols.constructors(cls)
            owner = symbols.cpp_class(receiver)
            if owner is not None:
                return symbols.method_lookup(owner, name)
            return [f for f in self._free_function(func, name) if f.qualname.endswith(callee)]
        receiver = receiver.replace("(*", "").replace(")", "").strip()
        if receiver in ("this", "(*this)"):
            return symbols.method_lookup(func.owner, name) if func.owner is not None else []
        type_name = self._types.locals_of(func).get(receiver)
        if type_name is None and func.owner is not None:
            cls = self._types.attr_class(func.owner, receiver)
            return symbols.method_lookup(cls, name) if cls is not None else []
        if type_name is not None:
            cls = symbols.cpp_class(unwrap(type_name))
            return symbols.method_lookup(cls, name) if cls is not None else []
        return []

    def constructed_class(self, callee: str) -> ClassInfo | None:
        if "." in callee or "->" in callee:
            return None
        return self._symbols.cpp_class(callee)

    def missing_names(self, func: Func, callee: str) -> set[str]:
        """Class or function names whose definition could resolve a call;
        never a plain method name on a receiver of unknown type."""
        receiver, name = split_callee(callee)
        if not receiver or ("." not in callee and "->" not in callee):
            names = {name}  # a free function, a static member, a construction
        else:
            type_name = self._types.locals_of(func).get(receiver)
            if type_name is None and func.owner is not None:
                type_name = self._types.member(func.owner, receiver)
            names = {unwrap(type_name).rsplit("::", 1)[-1]} if type_name else set()
        return {n for n in names if IDENTIFIER.fullmatch(n) and not _MACRO_LIKE.fullmatch(n) and len(n) > 3
                and not _CPP_EXTERNAL.match(n)}

    def _free_function(self, func: Func, name: str) -> list[Func]:
        self._symbols.deps.note("function:" + name)
        candidates = self._symbols.cpp_functions.get(name, [])
        if len(candidates) <= 1:
            return list(candidates)
        # several: a definition in the caller's own file is the one it calls
        # (a `static` helper named like another file's); then those sharing
        # the caller's namespace
        here = [c for c in candidates if c.path == func.path]
        if here and len({c.qualname for c in here}) == 1:
            return here
        quals = {c.qualname for c in candidates}
        if len(quals) == 1:
            return list(candidates)
        prefix = func.qualname.rsplit("::", 1)[0] if "::" in func.qualname else ""
        same_ns = [c for c in candidates if prefix and c.qualname.startswith(prefix + "::")]
        if len({c.qualname for c in same_ns}) == 1:
            return same_ns
        return []


def unwrap(type_name: str) -> str:
    from ..extract.cpp_names import unwrap_type

    return unwrap_type(type_name)
