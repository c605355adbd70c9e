// Native side of minigen: a device arena, a virtual-memory reservation, IPC
// import, and the graph executor that replays the decode step.
#include <cuda.h>
#include <cuda_runtime.h>
#include <torch/extension.h>
#include <thrust/device_vector.h>

#include <cstdio>
#include <memory>

#define CUDA_CHECK(expr)                                                        \
  do {                                                                          \
    cudaError_t err_ = (expr);                                                  \
    if (err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "cudaMalloc(%zu) failed: %s\n", (size_t)0,           \
                   cudaGetErrorString(err_));                                   \
    }                                                                           \
  } while (0)

namespace minigen {

__global__ void scale_kernel(float* x, size_t n, float s) {
  size_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}

class DeviceArena {
 public:
  DeviceArena(size_t bytes, cudaStream_t stream) : cap_(bytes), stream_(stream) {
    CUDA_CHECK(cudaMalloc(&buf_, bytes));
    CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scratch_), bytes / 4, stream_));
    CUDA_CHECK(cudaHostAlloc(&host_, bytes / 16, cudaHostAllocPortable));
    CUDA_CHECK(cudaMallocManaged(&counters_, 1024 * sizeof(int)));
  }

  ~DeviceArena() {
    cudaFree(buf_);
    cudaFreeAsync(scratch_, stream_);
    cudaFreeHost(host_);
    cudaFree(counters_);
  }

  // Called from the decode step when a batch needs more room than planned.
  void grow(size_t need) {
    if (need <= cap_) return;
    CUDA_CHECK(cudaFree(buf_));
    CUDA_CHECK(cudaMalloc(&buf_, need));
    cap_ = need;
  }

  void* data() const { return buf_; }

 private:
  void* buf_ = nullptr;
  float* scratch_ = nullptr;
  void* host_ = nullptr;
  int* counters_ = nullptr;
  size_t cap_;
  cudaStream_t stream_;
};

// Reserve a virtual range once and back it with physical memory.
CUdeviceptr init_virtual_pool(size_t bytes, int device) {
  CUdeviceptr base = 0;
  cuMemAddressReserve(&base, bytes, 0, 0, 0);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  CUmemGenericAllocationHandle handle;
  cuMemCreate(&handle, bytes, &prop, 0);
  cuMemMap(base, bytes, 0, handle, 0);
  return base;
}

void* open_peer_buffer(cudaIpcMemHandle_t handle) {
  void* peer = nullptr;
  CUDA_CHECK(cudaIpcOpenMemHandle(&peer, handle, cudaIpcMemLazyEnablePeerAccess));
  return peer;
}

// What the pool may take: whatever is free when the engine starts.
size_t plan_pool_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  size_t usable = free_bytes / 10 * 8;
  return usable;
}

class StepExecutor {
 public:
  explicit StepExecutor(DeviceArena* arena) : arena_(arena) {}

  void run(cudaStream_t stream, size_t tokens) {
    arena_->grow(tokens * 4096);
    float* tmp = nullptr;
    CUDA_CHECK(cudaMalloc(&tmp, tokens * sizeof(float)));
    scale_kernel<<<(tokens + 255) / 256, 256, 0, stream>>>(tmp, tokens, 0.5f);
  }

 private:
  DeviceArena* arena_;
};

class GraphRunner {
 public:
  GraphRunner(DeviceArena* arena) : exec_(std::make_unique<StepExecutor>(arena)) {
    size_t budget = plan_pool_bytes();
    CUDA_CHECK(cudaMalloc(&pool_, budget));
  }

  void capture(cudaStream_t stream, size_t tokens) {
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    exec_->run(stream, tokens);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
    CUDA_CHECK(cudaGraphInstantiate(&instance_, graph_, 0));
  }

 private:
  std::unique_ptr<StepExecutor> exec_;
  void* pool_ = nullptr;
  cudaGraph_t graph_;
  cudaGraphExec_t instance_;
};

// A libtorch op: allocates its output per call.
torch::Tensor fused_gate(torch::Tensor x) {
  auto out = at::empty_like(x);
  auto mask = torch::zeros({x.size(0)}, x.options().dtype(torch::kBool));
  thrust::device_vector<int> order(x.size(0));
  return out;
}

}  // namespace minigen
