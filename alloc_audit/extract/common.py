"""Stage 3, extract: what the Python and C++ extractors decide alike. Pure."""

from __future__ import annotations

from ..arglists import split_top_level

# factories whose shape arguments are all dimensions: a literal 0 among them
# makes a tensor with no elements, which holds no memory (an `empty(0)`
# placeholder, or an alias that `.set_(storage)` points at memory owned elsewhere)
_SHAPED = frozenset({"torch.empty", "torch.zeros", "torch.ones", "torch.rand", "torch.randn", "torch.empty_strided",
                     "Tensor.new_empty", "Tensor.new_zeros", "Tensor.new_ones", "cupy.empty", "cupy.zeros",
                     "at::empty", "at::zeros", "at::ones", "at::empty_strided", "torch::empty", "torch::zeros",
                     "torch::ones", "torch::empty_strided", "Tensor::new_empty", "Tensor::new_zeros"})


def zero_elements(api: str, shape: tuple[str, ...]) -> bool:
    """True when a shaped factory's dimensions include a literal 0."""
    if api not in _SHAPED or not shape:
        return False
    dims = shape[:1] if api.endswith("empty_strided") else shape
    if len(dims) == 1 and dims[0].strip()[:1] in "({[":
        dims = tuple(split_top_level(dims[0].strip()[1:-1]))
    return any(d.strip() == "0" for d in dims)
