/* A recorder for device memory taken outside PyTorch's caching allocator.
 *
 * Built as a shared library, it defines cudaMalloc, cudaMallocAsync,
 * cudaMallocHost, cudaHostAlloc, cudaMallocManaged, cudaFree, cudaFreeAsync,
 * cudaFreeHost and cudaIpcGetMemHandle, forwards each to the real CUDA
 * runtime (ALLOC_AUDIT_REAL_CUDART, else the next definition), and appends
 * one JSON line per call to ALLOC_AUDIT_NATIVE_LOG with the calling
 * thread's Python stack (when the caller runs Python) and its native frames
 * (symbol names from dladdr). Two ways to put it in front of the runtime:
 *
 *   LD_PRELOAD=librecorder.so python ...   calls that go through the PLT
 *   a library that is dlopen'ed by name (ctypes.CDLL("libcudart.so")):
 *     load this one instead (minigen's MINIGEN_CUDART)
 *
 * Calls the runtime makes to itself, and code that links the runtime
 * statically or reaches the driver API (cuMemAlloc, cuMemCreate) directly,
 * are not seen. `alloc-audit join --native LOG` reads the log
 * (docs/join.md, "Native memory").
 *
 *   cc -O2 -shared -fPIC -I$(python3 -c 'import sysconfig;print(sysconfig.get_paths()["include"])') \
 *      cudart_recorder.c -o librecorder.so -ldl
 */
#define _GNU_SOURCE
#include <Python.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
typedef void* cudaStream_t;

static FILE* log_file;
static void* real_lib;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int inside;

static void* real(const char* name) {
  if (!real_lib) {
    const char* path = getenv("ALLOC_AUDIT_REAL_CUDART");
    if (path) real_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  }
  void* fn = real_lib ? dlsym(real_lib, name) : NULL;
  return fn ? fn : dlsym(RTLD_NEXT, name);
}

static void json_str(FILE* f, const char* s) {
  fputc('"', f);
  for (; s && *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if ((unsigned char)*s < 0x20) { fprintf(f, "\\u%04x", *s); continue; }
    fputc(*s, f);
  }
  fputc('"', f);
}

static void python_frames(FILE* f) {
  fputs("\"frames\":[", f);
  if (!Py_IsInitialized()) { fputs("]", f); return; }
  PyGILState_STATE g = PyGILState_Ensure();
  PyFrameObject* frame = PyEval_GetFrame();
  if (frame) Py_INCREF(frame);
  int first = 1, depth = 0;
  while (frame && depth++ < 64) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    PyObject* file = PyObject_GetAttrString((PyObject*)code, "co_filename");
    PyObject* name = PyObject_GetAttrString((PyObject*)code, "co_name");
    if (!first) fputc(',', f);
    first = 0;
    fputs("{\"filename\":", f);
    json_str(f, file ? PyUnicode_AsUTF8(file) : "??");
    fprintf(f, ",\"line\":%d,\"name\":", PyFrame_GetLineNumber(frame));
    json_str(f, name ? PyUnicode_AsUTF8(name) : "??");
    fputc('}', f);
    Py_XDECREF(file);
    Py_XDECREF(name);
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  PyErr_Clear();
  PyGILState_Release(g);
  fputs("]", f);
}

static void native_frames(FILE* f) {
  void* pcs[24];
  int n = backtrace(pcs, 24);
  fputs(",\"native\":[", f);
  int first = 1;
  for (int i = 2; i < n; i++) {
    Dl_info info;
    if (!dladdr(pcs[i], &info)) continue;
    if (!first) fputc(',', f);
    first = 0;
    fputs("{\"name\":", f);
    json_str(f, info.dli_sname ? info.dli_sname : "??");
    fputs(",\"object\":", f);
    json_str(f, info.dli_fname ? info.dli_fname : "??");
    fputc('}', f);
  }
  fputs("]", f);
}

static void record(const char* action, const char* api, void* addr, size_t size, int rc) {
  if (inside) return;
  inside = 1;
  pthread_mutex_lock(&lock);
  if (!log_file) {
    const char* path = getenv("ALLOC_AUDIT_NATIVE_LOG");
    log_file = fopen(path ? path : "alloc-audit-native.jsonl", "a");
  }
  if (log_file) {
    fprintf(log_file, "{\"action\":\"%s\",\"api\":\"%s\",\"addr\":%llu,\"size\":%zu,\"rc\":%d,", action, api,
            (unsigned long long)(size_t)addr, size, rc);
    python_frames(log_file);
    native_frames(log_file);
    fputs("}\n", log_file);
    fflush(log_file);
  }
  pthread_mutex_unlock(&lock);
  inside = 0;
}

#define ALLOC(fn, params, args, ptr, size)                    \
  cudaError_t fn params {                                     \
    cudaError_t (*r) params = (cudaError_t(*) params)real(#fn); \
    cudaError_t rc = r args;                                  \
    record("alloc", #fn, rc == 0 ? *(ptr) : NULL, size, rc);  \
    return rc;                                                \
  }
#define FREE(fn, params, args, p)                             \
  cudaError_t fn params {                                     \
    cudaError_t (*r) params = (cudaError_t(*) params)real(#fn); \
    record("free", #fn, p, 0, 0);                             \
    return r args;                                            \
  }

ALLOC(cudaMalloc, (void** p, size_t n), (p, n), p, n)
ALLOC(cudaMallocAsync, (void** p, size_t n, cudaStream_t s), (p, n, s), p, n)
ALLOC(cudaMallocManaged, (void** p, size_t n, unsigned flags), (p, n, flags), p, n)
ALLOC(cudaMallocHost, (void** p, size_t n), (p, n), p, n)
ALLOC(cudaHostAlloc, (void** p, size_t n, unsigned flags), (p, n, flags), p, n)
FREE(cudaFree, (void* p), (p), p)
FREE(cudaFreeAsync, (void* p, cudaStream_t s), (p, s), p)
FREE(cudaFreeHost, (void* p), (p), p)

/* minigen's IPC channel exports what it allocates: forwarded unchanged */
cudaError_t cudaIpcGetMemHandle(void* handle, void* p) {
  cudaError_t (*r)(void*, void*) = (cudaError_t(*)(void*, void*))real("cudaIpcGetMemHandle");
  return r(handle, p);
}
