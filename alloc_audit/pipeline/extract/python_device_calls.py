"""Stage 3, extract (Python): ``python_device_flow``'s walk, continued -- the
device of a call's result (a torch op or factory, a tensor method, a move)
and what a binding does to the environment (names, attribute chains, lists
grown, joins of two paths). Pure.
"""

from __future__ import annotations

import ast

from .python_device_values import (
    _DTYPE,
    _DTYPES,
    _EMPTY,
    _FACTORIES,
    _HOST_MAKERS,
    _KEEPS_BUILTINS,
    _NOT_OPS,
    _OP_NAMESPACES,
    _SCALAR,
    _SCALAR_BUILTINS,
    _SCALAR_VAL,
    _STAYS,
    _UNKNOWN,
    _WRAPPERS,
    DEFAULT,
    HOST,
    NONE,
    Env,
    Val,
    _data,
    _Values,
)

# torch classes whose instance holds the memory of the one tensor they are given
_WRAPS = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.nn.Buffer",
                    "torch.nn.parameter.Buffer"})


# checkpoint readers whose tensors land on the device they are told (``_CallValues.loaded``)
_LOADERS = frozenset({"torch.load", "safetensors.torch.load_file", "safetensors.torch.load"})


class _CallValues(_Values):
    """The device of a call's result."""

    def call(self, node: ast.Call, env: Env, depth: int) -> Val:
        func = node.func
        keywords = {k.arg: k.value for k in node.keywords}
        for k in node.keywords:
            self.dev(k.value, env, depth)
        loader = self.resolve(func) if isinstance(func, (ast.Attribute, ast.Name)) else ""
        if loader in _LOADERS:
            return self.loaded(node, loader, keywords, env, depth)
        if isinstance(func, ast.Attribute):
            name = self.resolve(func)
            if name.startswith("torch.") and name.count(".") == 1 or name.startswith(_OP_NAMESPACES):
                return self.torch_call(node, name, keywords, env, depth)
            if name.startswith("torch."):
                args = [self.dev(a, env, depth) for a in node.args]
                if name in _WRAPS and len(args) == 1 and args[0].uniform and not args[0].listy:
                    return Val(args[0].token, True)  # round 32: `nn.Parameter(t)` holds `t`'s memory
                return Val(self.fresh("call", node))
            return self.method(node, func, keywords, env, depth)
        args = [self.dev(a, env, depth) for a in node.args]
        if isinstance(func, ast.Name) and func.id not in env and func.id not in self.params:
            if func.id in _SCALAR_BUILTINS:
                return _SCALAR_VAL
            if func.id in _KEEPS_BUILTINS and len(args) == 1:
                return Val(args[0].token, args[0].uniform, func.id != "tuple")
            if func.id in ("dict", "set", "frozenset", "zip", "enumerate", "map", "filter"):
                return Val(self.fresh("call", node))
            kept = self.follows(node, func.id, False, args, env)
            if kept is not None:
                return kept  # round 35: a function of the file that returns where its argument is
        self.escapes(node, env)
        if "return_tensors" in keywords and isinstance(keywords["return_tensors"], ast.Constant) \
                and keywords["return_tensors"].value == "pt":
            return Val(HOST, True)  # a tokenizer's output: host tensors
        return Val(self.fresh("call", node))

    def follows(self, node: ast.Call, name: str, method: bool, args: list[Val], env: Env) -> Val | None:
        """The call ``node`` of ``name`` (``self.name``), a function of the file every return of which is on the
        device of one parameter (``python_device_returns``): on the device of the argument given for it."""
        from .python_device_returns import returned_param  # imported here: it walks with this module's Flow

        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return None
        found = returned_param(self.ext, name, method)
        if found is None:
            return None
        param, at = found
        given = next((k.value for k in node.keywords if k.arg == param), None)
        value = self.dev(given, env) if given is not None else args[at] if 0 <= at < len(args) else None
        if value is None or value.listy or value.token in (None, _SCALAR, _DTYPE, NONE, _EMPTY):
            return None  # a list: the function may return another device's tensor of it
        return Val(value.token, True)  # a token names the device of the argument, a tensor (the function reads it)

    def loaded(self, node: ast.Call, loader: str, keywords: dict[str | None, ast.expr], env: Env, depth: int) -> Val:
        """Round 33: what a checkpoint reader returns holds tensors on the device it was told: ``torch.load``'s
        ``map_location`` when it names a device (a dict or a function names none: unknown; none given: where
        they were saved, unknown), ``safetensors.torch.load_file``'s ``device`` (the host by default), the
        host for ``safetensors.torch.load``."""
        for a in node.args:
            self.dev(a, env, depth)
        if None in keywords or any(isinstance(a, ast.Starred) for a in node.args):
            return Val(self.fresh("call", node))
        if loader == "safetensors.torch.load":
            return Val(HOST, True)
        slot = "map_location" if loader == "torch.load" else "device"
        given = keywords.get(slot, node.args[1] if len(node.args) > 1 else None)
        if given is None:
            return Val(HOST, True) if loader != "torch.load" else Val(self.fresh("call", node))
        token = self.device(given, env)
        if token is None or token in (NONE, _SCALAR, _DTYPE, _EMPTY):
            return Val(self.fresh("call", node))
        return Val(token, True)

    def escapes(self, node: ast.Call, env: Env) -> None:
        """A list handed to a call of unknown code may be grown by it with anything."""
        for a in (*node.args, *(k.value for k in node.keywords)):
            key = self.key(a.value if isinstance(a, ast.Starred) else a)
            if key is not None and key in env and env[key].listy:
                env[key] = Val(self.fresh("escaped", node), False, True)

    def torch_call(self, node: ast.Call, name: str, keywords: dict[str | None, ast.expr], env: Env,
                   depth: int) -> Val:
        attr = name.rsplit(".", 1)[1]
        args = [self.dev(a, env, depth) for a in node.args]
        if None in keywords or "out" in keywords:
            return _UNKNOWN  # `**kwargs` that may hold a device, or an output buffer
        if name.count(".") == 1 and attr in _NOT_OPS:
            if attr == "device":
                token = self.device(node, env)
                return Val(token) if token is not None else _UNKNOWN
            return Val(self.fresh("call", node))
        if attr in _DTYPES:
            return Val(_DTYPE)
        given = keywords.get("device")
        if given is not None:
            token = self.device(given, env)
            if token == NONE:
                return self.default(env)
            return Val(token, True) if token is not None else _UNKNOWN
        if keywords.get("pin_memory") is not None and not (
                isinstance(keywords["pin_memory"], ast.Constant) and keywords["pin_memory"].value is False):
            return Val(HOST, True)
        if attr in _HOST_MAKERS:
            return Val(HOST, True)
        if attr.endswith("_like"):
            return Val(args[0].token, True) if args and args[0].token not in (_SCALAR, _DTYPE) else _UNKNOWN
        if attr in _FACTORIES:
            if attr in ("tensor", "Tensor") and node.args and not _data(node.args[0]) and not args[0].listy:
                token = args[0].token  # of a tensor: a copy where it is
                return Val(token, True) if args[0].uniform and token is not None else _UNKNOWN
            return self.default(env)
        if attr in _WRAPPERS:
            if node.args and _data(node.args[0]):
                return self.default(env)
            return Val(args[0].token, True) if args and args[0].uniform and args[0].token is not None else _UNKNOWN
        flat: list[Val] = []
        nodes: list[ast.expr] = []
        for a, v in zip(node.args, args, strict=True):
            if isinstance(a, (ast.List, ast.Tuple)):
                for e in a.elts:
                    flat.append(self.dev(e, env, depth))
                    nodes.append(e)
            else:
                flat.append(v if v.uniform or v.token is None or not v.listy else Val(None))
                nodes.append(a)
        return self.combine(flat, nodes)

    def method(self, node: ast.Call, func: ast.Attribute, keywords: dict[str | None, ast.expr], env: Env,
               depth: int) -> Val:
        attr = func.attr
        receiver = self.dev(func.value, env, depth)
        args = [self.dev(a, env, depth) for a in node.args]
        if attr == "to":
            where = self.target(node, env)
            if where == _DTYPE:
                return Val(receiver.token, receiver.uniform) if receiver.token not in (_SCALAR, _EMPTY) else _UNKNOWN
            if where == NONE:
                return receiver
            return Val(where, receiver.uniform) if where is not None else _UNKNOWN
        if attr == "cuda":
            if None in keywords:
                return _UNKNOWN
            if node.args:
                token = self.device(node.args[0], env)
                return Val(token, receiver.uniform) if token is not None and token != NONE else _UNKNOWN
            given = keywords.get("device")
            if given is not None:
                token = self.device(given, env)
                return Val(token, receiver.uniform) if token is not None and token != NONE else _UNKNOWN
            return Val(self.cuda(node), receiver.uniform)
        if attr in ("cpu", "pin_memory"):
            return Val(HOST, receiver.uniform)
        if attr in ("eval", "train") and not node.keywords and len(node.args) <= 1:
            return receiver  # `model.eval()`: a module returns itself
        if attr in ("item", "tolist", "numpy", "size", "dim", "numel", "element_size", "data_ptr", "stride",
                    "nelement", "is_contiguous", "is_pinned", "get_device", "storage_offset", "nbytes"):
            return _SCALAR_VAL
        if isinstance(func.value, ast.Name) and func.value.id == "self" and "self" not in env:
            kept = self.follows(node, attr, True, args, env)
            if kept is not None:
                return kept  # round 35: `self.m(x)` of a method of the file that returns where `x` is
        if receiver.token in (None, _SCALAR, _DTYPE, NONE) or receiver.listy and not receiver.uniform:
            self.escapes(node, env)
            return Val(self.fresh("call", node))
        if attr.startswith("new_") and attr in _STAYS:
            given = keywords.get("device")
            if given is not None:
                token = self.device(given, env)
                return Val(token, True) if token is not None and token != NONE else _UNKNOWN
            return Val(receiver.token, True)
        if attr == "type" and len(args) == 1 and not keywords and args[0].token == _DTYPE:
            # round 35: `x.type(torch.int32)` casts where `x` is (a type *string* may name a device: not read)
            return Val(receiver.token, receiver.uniform)
        if attr == "type_as":
            return Val(receiver.token, True) if args and args[0].token == receiver.token else _UNKNOWN
        if attr in _STAYS and "device" not in keywords:
            return Val(receiver.token, True) if receiver.uniform else Val(receiver.token)
        self.escapes(node, env)
        return Val(self.fresh("call", node))


class Bindings(_CallValues):
    """What bindings and joins do to the environment."""

    parents: dict[int, ast.AST]
    before: dict[int, Env]

    def bind(self, target: ast.expr, value: Val, node: ast.expr | None, env: Env) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            elts = target.elts
            if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) == len(elts) \
                    and not any(isinstance(e, ast.Starred) for e in (*elts, *node.elts)):
                values = [self.dev(e, env) for e in node.elts]  # evaluated before any target is bound
                for t, v, n in zip(elts, values, node.elts, strict=True):
                    self.bind(t, v, n, env)
                return
            for i, t in enumerate(elts):
                if isinstance(t, ast.Starred):
                    self.bind(t.value, Val(value.token if value.uniform else None, value.uniform, True), None, env)
                elif value.uniform:
                    self.bind(t, Val(value.token, True), None, env)
                elif value.token is not None and value.token not in (_SCALAR, HOST, DEFAULT) \
                        and not any(isinstance(e, ast.Starred) for e in elts):
                    self.bind(t, Val(f"{value.token}[{i}]"), None, env)
                else:
                    self.bind(t, _UNKNOWN, None, env)
            return
        if isinstance(target, ast.Starred):
            self.bind(target.value, Val(None, False, True), None, env)
            return
        if isinstance(target, ast.Subscript):
            key = self.key(target.value)
            if key is None:
                return
            old = self.dev(target.value, env)
            if old.listy:
                env[key] = self.add(old, value)
            elif not old.uniform:
                self.forget(key, env)
                env[key] = Val(self.fresh("stored", target))  # an entry of a dict or an object replaced
            return  # a tensor written in place stays where it is
        key = self.key(target)
        if key is None:
            return
        if isinstance(target, ast.Attribute) and target.attr == "data":
            base = self.key(target.value)
            if base is not None:  # `p.data = v`: the tensor `p` now holds `v`'s memory
                self.forget(base, env)
                env[base] = Val(value.token, value.uniform)
            return
        self.forget(key, env)
        env[key] = value

    def bind_element(self, target: ast.expr, element: list[Val] | Val | None, node: ast.AST, env: Env) -> None:
        """A loop target bound to an element of what it iterates (``zip`` and ``enumerate`` split)."""
        if isinstance(element, list) and isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == len(element):
            for t, v in zip(target.elts, element, strict=True):
                self.bind_element(t, v, node, env)
            return
        if isinstance(element, Val) and element.uniform and element.token is not None:
            self.bind(target, Val(element.token, True), None, env)
            return
        for name in self.names_in(target):
            self.forget(name, env)
            env[name] = Val(self.fresh(f"iter:{name}", node))  # another value on each pass

    def element(self, it: ast.expr, env: Env) -> list[Val] | Val | None:
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and not it.keywords \
                and not any(isinstance(a, ast.Starred) for a in it.args):
            if it.func.id == "zip" and it.func.id not in env:
                return [self.dev(a, env) for a in it.args]
            if it.func.id == "enumerate" and len(it.args) == 1 and it.func.id not in env:
                return [_SCALAR_VAL, self.dev(it.args[0], env)]
            if it.func.id == "range":
                return _SCALAR_VAL
        value = self.dev(it, env)
        return value if value.uniform else None

    def forget(self, key: str, env: Env) -> None:
        """``key`` is bound again: what was known of its attributes no longer holds."""
        prefix = key + "."
        for k in [k for k in env if k.startswith(prefix)]:
            del env[k]
        env.pop(key, None)

    def add(self, old: Val, added: Val) -> Val:
        """A list's token once ``added`` (an element) joins it."""
        if old.token == _EMPTY:
            return Val(added.token, added.token is not None, True)
        if old.uniform and added.token == old.token:
            return old
        return Val(None, False, True)

    def join(self, a: Env | None, b: Env | None, node: ast.AST) -> Env | None:
        if a is None:
            return b
        if b is None:
            return a
        out: Env = {}
        for key in a.keys() | b.keys():
            x, y = self.implicit(a, key), self.implicit(b, key)
            if x is None or y is None:
                present = x if x is not None else y
                if key.isidentifier() and key not in self.params and present is not None:
                    out[key] = present  # bound on one path only: read, it is that path's (or unbound)
                else:
                    out[key] = Val(self.fresh(f"phi:{key}", node))
            else:
                out[key] = self.join_val(x, y, key, node)
        return out

    def implicit(self, env: Env, key: str) -> Val | None:
        """``key``'s value in ``env``, also when no statement bound it yet: a parameter's or a free name's
        own, an attribute chain's, the default device; None for a local not bound on this path."""
        if key in env:
            return env[key]
        if key == "<default>":
            return Val(DEFAULT)
        if key.isidentifier():
            return None if key in self.bound and key not in self.params else self.lookup(key, env)
        head, _, attr = key.rpartition(".")  # an attribute chain: as `dev` reads one
        base = self.implicit(env, head)
        if base is None or base.token is None or base.token in (_SCALAR, _DTYPE, NONE, HOST, DEFAULT, _EMPTY):
            return Val(base.token, True) if base is not None and base.uniform else _UNKNOWN
        return Val(base.token, True) if base.uniform else Val(f"{base.token}.{attr}")

    def join_val(self, x: Val, y: Val, key: str, node: ast.AST) -> Val:
        if x == y:
            return x
        if x.listy and y.listy and _EMPTY in (x.token, y.token):
            return y if x.token == _EMPTY else x
        return Val(self.fresh(f"phi:{key}", node), x.uniform and y.uniform, x.listy and y.listy)

    def names_in(self, target: ast.AST) -> list[str]:
        return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]

    def stored(self, node: ast.AST) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} | {
            k for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
            for k in [self.key(n)] if k is not None}

    def stored_in(self, body: list[ast.stmt]) -> set[str]:
        out: set[str] = set()
        for stmt in body:
            out |= self.stored(stmt)
            for n in ast.walk(stmt):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                    key = self.key(n.func.value)
                    if key is not None:
                        out.add(key)  # `xs.append(v)`, `model.cuda()`: changed in place
        return out

    def env_at(self, call: ast.AST) -> Env | None:
        """The environment just before ``call`` runs: its statement's, with the targets of the
        comprehensions and lambdas around it bound."""
        chain: list[ast.AST] = []
        up: ast.AST | None = call
        while up is not None and not isinstance(up, ast.stmt):
            chain.append(up)
            up = self.parents.get(id(up))
        if up is None or id(up) not in self.before:
            return None
        env = dict(self.before[id(up)])
        for node in reversed(chain):
            if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)):
                for gen in node.generators:
                    self.bind_element(gen.target, self.element(gen.iter, env), node, env)
            elif isinstance(node, ast.Lambda):
                for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
                    env[a.arg] = Val(self.fresh(f"lambda:{a.arg}", node))
        return env
