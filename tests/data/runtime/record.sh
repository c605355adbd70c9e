#!/usr/bin/env bash
# How the committed snapshots were recorded (on the accelerator machine: one
# H200, python3 with torch and transformers). Run from a folder holding
# alloc_audit/, examples/, tools/native/ and this folder; outputs go to $OUT.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__); print(torch.cuda.get_device_name())'

# 1. the demo engine, recorded by the recording helper
(cd examples && python3 -m alloc_audit.record --out "$OUT" --max-entries 100000 -- -m minigen.demo --steps 16) \
  && mv "$OUT/snapshot-rank0.pickle.gz" "$OUT/minigen-python.pickle.gz"
# 2. the same with C++ frames too (stacks="all")
(cd examples && python3 -m alloc_audit.record --out "$OUT" --stacks all --max-entries 100000 -- -m minigen.demo --steps 16) \
  && mv "$OUT/snapshot-rank0.pickle.gz" "$OUT/minigen-all.pickle.gz"
# 3. a third-party model: a random Hugging Face Llama, static cache
python3 -m alloc_audit.record --out "$OUT" --max-entries 100000 -- tests/data/runtime/hf_llama_static.py \
  && mv "$OUT/snapshot-rank0.pickle.gz" "$OUT/hf-llama-static.pickle.gz"
# 4. native memory outside PyTorch's allocator: the recorder shim in front of
#    the runtime minigen's IPC channels dlopen by name
REAL=$(python3 -c 'import glob,os,torch; print(sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__),"..","nvidia","*","lib","libcudart.so*")))[0])')
cc -O2 -shared -fPIC -I"$(python3 -c 'import sysconfig;print(sysconfig.get_paths()["include"])')" \
  tools/native/cudart_recorder.c -o /tmp/librecorder.so -ldl
(cd examples && MINIGEN_CUDART=/tmp/librecorder.so ALLOC_AUDIT_REAL_CUDART=$REAL \
  ALLOC_AUDIT_NATIVE_LOG="$OUT/minigen-native.jsonl" python3 -m minigen.demo --steps 4)
# 5. tried: the same recorder as LD_PRELOAD, in front of everything that links the runtime dynamically
(cd examples && LD_PRELOAD=/tmp/librecorder.so ALLOC_AUDIT_NATIVE_LOG="$OUT/minigen-preload.jsonl" \
  timeout 120 python3 -m minigen.demo --steps 4; gzip -9 "$OUT/minigen-preload.jsonl")
# 6. tried: compute-sanitizer's leak report (allocations alive at exit)
(cd examples && timeout 240 compute-sanitizer --tool memcheck --leak-check full --show-backtrace host \
  --print-limit 40 python3 -m minigen.demo --steps 2 > "$OUT/sanitizer.txt" 2>&1; echo "sanitizer rc $?")
# 7. the native side for real: csrc/ built as a torch extension (-O0, no
#    inlining), C++ frames on, a device arena kept and a libtorch op
(cd examples && python3 -m alloc_audit.record --out "$OUT" --stacks all --max-entries 100000 -- \
  -m minigen.demo --steps 4 --native) && mv "$OUT/snapshot-rank0.pickle.gz" "$OUT/minigen-native-all.pickle.gz"
# 8. compute-sanitizer's leak report of the same (the extension is built by then)
(cd examples && timeout 240 compute-sanitizer --tool memcheck --leak-check full --show-backtrace host \
  --print-limit 60 python3 -m minigen.demo --steps 2 --native > "$OUT/sanitizer-native.txt" 2>&1; \
  echo "sanitizer (native) rc $?"; gzip -9 "$OUT/sanitizer-native.txt")
