// Python bindings that let `python -m minigen.demo --native` run the native
// side for real (built with torch.utils.cpp_extension.load; the demo only).
#include "allocator.cu"

namespace minigen {

// Kept for the process lifetime on purpose: a leak report lists its blocks.
static DeviceArena* kept_arena = nullptr;

void run_native(int64_t bytes) {
  kept_arena = new DeviceArena(static_cast<size_t>(bytes), nullptr);
  kept_arena->grow(static_cast<size_t>(2 * bytes));
}

}  // namespace minigen

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fused_gate", &minigen::fused_gate, "a libtorch op that allocates its output per call");
  m.def("run_native", &minigen::run_native, "a device arena that grows once and is kept");
}
