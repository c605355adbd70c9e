"""Native allocations whose device follows a tensor the function proves is
on the host: a factory given ``x.options()`` (directly, through a local
``auto opts = x.options().dtype(...)``) or ``empty_like(x)`` makes a CPU
tensor when the same function checks ``x`` is a CPU tensor
(``TORCH_CHECK(x.is_cpu())``, ``AT_ASSERTM(x.device().is_cpu(), ...)``,
``TORCH_CHECK(!x.is_cuda())``, ``CHECK_CPU(x)``, ``TENSOR_ON_CPU(x)``) or
reads it through a host accessor (``x.accessor<float, 2>()``: element
access from host code, which only a CPU tensor allows), or when the new
tensor itself is read so (``auto out = at::empty(n, x.options());
auto out_a = out.accessor<float, 1>();``). ``packed_accessor*`` is the
device form and proves nothing. A device the function does not prove stays
a site (DESIGN: device unknown is a site), and so does every allocation of
a function that names CUDA anywhere (`TENSOR_ON_CUDA_GPU(x)` beside a host
accessor). An input of a function registered only for the CPU dispatch key
(``cpp_meta.host_only``) is a CPU tensor too. Part of the C++ extractor
(``cpp_sites.add_site``). Pure: text -> bool."""

from __future__ import annotations

import re

from ..names import IDENTIFIER

# `x.options()`, `x->options()`, `(*x).options()` at the head of an options expression
_OPTIONS_OF = re.compile(r"\(?\*?([A-Za-z_]\w*)\)?\s*(?:\.|->)\s*options\s*\(\s*\)")
_CHECK_MACRO = r"(?:TORCH_CHECK\w*|TORCH_INTERNAL_ASSERT\w*|AT_ASSERTM?|assert)"
_DEVICE_CPU = r"(?:(?:at|torch|c10)::(?:kCPU|DeviceType::CPU)|(?:at|torch|c10)::Device\((?:at|torch|c10)::kCPU\))"


_DEVICE_WORD = re.compile(r"cuda|CUDA")
_NOT_CUDA = re.compile(r"!\s*[\w.>-]+?\s*(?:\.|->)\s*is_cuda\s*\(\s*\)")


def names_device(function_text: str) -> bool:
    """Whether a function names CUDA (`TENSOR_ON_CUDA_GPU(x)`, `x.is_cuda()`,
    a CUDA guard or launch) other than to check a tensor is not there
    (`!x.is_cuda()`): its host reads then prove nothing."""
    return _DEVICE_WORD.search(_NOT_CUDA.sub("", function_text)) is not None


def source_tensor(options: str | None, args: list[str]) -> str | None:
    """The tensor whose device a factory follows: ``x`` of ``x.options()...``
    (options last), else the first argument of a ``*_like(x)`` given no
    options."""
    if options is not None:
        m = _OPTIONS_OF.match(options.strip())
        return m.group(1) if m is not None else None
    if args and IDENTIFIER.fullmatch(args[0].strip()):
        return args[0].strip()
    return None


def bound_options(body: str, name: str) -> str | None:
    """What a local options variable ``name`` is bound to above the call
    (`auto long_opts = lengths1.options().dtype(torch::kInt64);`) when it is
    bound once and assigned nowhere else; None otherwise."""
    if not IDENTIFIER.fullmatch(name):
        return None
    found = re.findall(rf"(?<![\w.>]){re.escape(name)}\s*=(?!=)\s*([^;]*);", body)
    if len(found) != 1:
        return None
    return " ".join(found[0].split())


def proven_host(body: str, name: str) -> bool:
    """Whether the function ``body`` proves the tensor ``name`` is on the host."""
    if name not in body:
        return False
    n = re.escape(name)
    return bool(
        re.search(rf"(?<![\w.>]){n}\s*(?:\.|->)\s*accessor\s*<", body)
        or re.search(rf"\b[A-Z_]*(?:CHECK|ON|IS|ASSERT)[A-Z_]*CPU[A-Z_]*\s*\(\s*{n}\s*[,)]", body)
        or re.search(rf"\b{_CHECK_MACRO}\s*\(\s*(?:{n}\s*(?:\.|->)\s*(?:device\s*\(\s*\)\s*\.\s*)?is_cpu\s*\(\s*\)"
                     rf"|!\s*{n}\s*(?:\.|->)\s*is_cuda\s*\(\s*\)"
                     rf"|{n}\s*(?:\.|->)\s*device\s*\(\s*\)\s*(?:\.\s*type\s*\(\s*\)\s*)?==\s*{_DEVICE_CPU})",
                     body)
    )
