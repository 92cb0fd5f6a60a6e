#!/usr/bin/env python3
"""A pod's process for carve's acceptance run, on libcuda.so.1 alone
(ctypes: no PyTorch, no wheels). It reports to a JSON file, written whole
each time (temp file, rename).

  cudaclient.py --report FILE --info
      the devices CUDA sees: {"state": "info", "count": N,
      "devices": [{"uuid": "8-4-4-4-12 hex", "totalMem": bytes}]}
  cudaclient.py --report FILE --alloc-gib N [--hold S] [--compute]
      allocates N GiB on device 0 and touches it, then holds it for S
      seconds, or keeps the GPU busy (memset and copy) for S seconds;
      states: refused, allocated, computing, done, faulted
"""
import argparse, ctypes, json, os, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--report", required=True)
ap.add_argument("--info", action="store_true")
ap.add_argument("--alloc-gib", type=float, default=0)
ap.add_argument("--hold", type=float, default=3.0)
ap.add_argument("--compute", action="store_true")
a = ap.parse_args()


def report(**kw):
    kw["pid"] = os.getpid()
    tmp = a.report + ".tmp"
    with open(tmp, "w") as f:
        json.dump(kw, f)
    os.replace(tmp, a.report)


class CudaError(Exception):
    pass


try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    report(state="refused", error="libcuda.so.1: " + str(e)[:300])
    sys.exit(3)


def check(name, rc):
    if rc != 0:
        msg = ctypes.c_char_p()
        cuda.cuGetErrorString(rc, ctypes.byref(msg))
        raise CudaError("%s: %d %s" % (name, rc, (msg.value or b"").decode()))


def call(name, *args):
    check(name, getattr(cuda, name)(*args))


def fmt_uuid(raw):
    h = bytes(raw).hex()
    return "-".join([h[0:8], h[8:12], h[12:16], h[16:20], h[20:32]])


def devices():
    n = ctypes.c_int()
    call("cuDeviceGetCount", ctypes.byref(n))
    out = []
    for i in range(n.value):
        dev = ctypes.c_int()
        call("cuDeviceGet", ctypes.byref(dev), i)
        uuid = (ctypes.c_ubyte * 16)()
        # _v2 names a MIG device by its own UUID, as NVML does (CUDA 11.4+).
        fn = "cuDeviceGetUuid_v2" if hasattr(cuda, "cuDeviceGetUuid_v2") else "cuDeviceGetUuid"
        call(fn, uuid, dev)
        mem = ctypes.c_size_t()
        call("cuDeviceTotalMem_v2", ctypes.byref(mem), dev)
        out.append({"uuid": fmt_uuid(uuid), "totalMem": mem.value})
    return out


try:
    call("cuInit", 0)
    if a.info:
        d = devices()
        report(state="info", count=len(d), devices=d)
        sys.exit(0)
    dev = ctypes.c_int()
    call("cuDeviceGet", ctypes.byref(dev), 0)
    ctx = ctypes.c_void_p()
    # The primary context: the one API every CUDA version keeps.
    call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    call("cuCtxSetCurrent", ctx)
    size = int(a.alloc_gib * (1 << 30))
    ptr = ctypes.c_uint64()
    call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(size))
    call("cuMemsetD8_v2", ptr, ctypes.c_ubyte(1), ctypes.c_size_t(size))
    call("cuCtxSynchronize")
except CudaError as e:  # refused: out of memory, or no context at all
    report(state="refused", error=str(e)[:300])
    sys.exit(3)
report(state="allocated")
if not a.compute:
    time.sleep(a.hold)
    report(state="done")
    sys.exit(0)
# Busy: the first half of the allocation copied over the second and set
# again, so the GPU works throughout and a fault shows at once.
half = size // 2
beats = 0
deadline = time.time() + a.hold
while time.time() < deadline:
    try:
        call("cuMemcpyDtoD_v2", ctypes.c_uint64(ptr.value + half), ptr, ctypes.c_size_t(half))
        call("cuMemsetD32_v2", ptr, ctypes.c_uint(beats), ctypes.c_size_t(half // 4))
        call("cuCtxSynchronize")
    except CudaError as e:
        report(state="faulted", beats=beats, error=str(e)[:300])
        sys.exit(4)
    beats += 1
    if beats % 50 == 0:
        report(state="computing", beats=beats)
report(state="done", beats=beats)
