#!/usr/bin/env python3
"""Records what a real GPU's NVML answers about MIG, straight from
libnvidia-ml.so.1 through ctypes (not through go-nvml), so carve's replays
and tests can be checked against the card rather than against a binding.

  nvmlrecord.py > record.json

For every GPU: identity, memory, MIG, compute and persistence modes, the
recovery action the driver asks (r570 on); for every GPU
instance profile *index* NVML defines (0..31 tried), the v3 profile info
(its Id, the driver's name, slices, engines, memory) and the placements
NVML reports for that profile's Id. Errors are recorded, never fatal.
"""
import ctypes, json, sys

nvml = ctypes.CDLL("libnvidia-ml.so.1")


class ProfileInfoV3(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("id", ctypes.c_uint), ("sliceCount", ctypes.c_uint),
                ("instanceCount", ctypes.c_uint), ("multiprocessorCount", ctypes.c_uint),
                ("copyEngineCount", ctypes.c_uint), ("decoderCount", ctypes.c_uint),
                ("encoderCount", ctypes.c_uint), ("jpegCount", ctypes.c_uint), ("ofaCount", ctypes.c_uint),
                ("memorySizeMB", ctypes.c_ulonglong), ("name", ctypes.c_char * 96), ("capabilities", ctypes.c_uint)]


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class FieldValue(ctypes.Structure):
    # nvmlFieldValue_t; the value union read whole (little-endian: an
    # unsigned int is its low 32 bits).
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int),
                ("value", ctypes.c_ulonglong)]


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def err(rc):
    nvml.nvmlErrorString.restype = ctypes.c_char_p
    return {"rc": rc, "error": nvml.nvmlErrorString(rc).decode()}


def text(fn, dev, size=96):
    buf = ctypes.create_string_buffer(size)
    rc = fn(dev, buf, size)
    return buf.value.decode() if rc == 0 else err(rc)


def main():
    rc = nvml.nvmlInit_v2()
    if rc:
        json.dump({"init": err(rc)}, sys.stdout)
        return
    out = {"devices": []}
    drv = ctypes.create_string_buffer(96)
    nvml.nvmlSystemGetDriverVersion(drv, 96)
    out["driverVersion"] = drv.value.decode()
    n = ctypes.c_uint()
    nvml.nvmlDeviceGetCount_v2(ctypes.byref(n))
    for i in range(n.value):
        dev = ctypes.c_void_p()
        nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(dev))
        d = {"index": i, "uuid": text(nvml.nvmlDeviceGetUUID, dev), "name": text(nvml.nvmlDeviceGetName, dev)}
        mem = Memory()
        rc = nvml.nvmlDeviceGetMemoryInfo(dev, ctypes.byref(mem))
        d["memoryTotal"] = mem.total if rc == 0 else err(rc)
        cur, pend = ctypes.c_uint(), ctypes.c_uint()
        rc = nvml.nvmlDeviceGetMigMode(dev, ctypes.byref(cur), ctypes.byref(pend))
        d["migMode"] = [cur.value, pend.value] if rc == 0 else err(rc)
        cm = ctypes.c_int()
        rc = nvml.nvmlDeviceGetComputeMode(dev, ctypes.byref(cm))
        d["computeMode"] = cm.value if rc == 0 else err(rc)
        pm = ctypes.c_int()
        rc = nvml.nvmlDeviceGetPersistenceMode(dev, ctypes.byref(pm))
        d["persistenceMode"] = pm.value if rc == 0 else err(rc)
        # The recovery action the driver asks (r570 on): field 230,
        # FI_DEV_GET_GPU_RECOVERY_ACTION; the value's own return says
        # whether the driver has it.
        fv = FieldValue(fieldId=230)
        rc = nvml.nvmlDeviceGetFieldValues(dev, 1, ctypes.byref(fv))
        val = fv.value & 0xFFFFFFFF if fv.valueType in (1, 5) else fv.value
        d["recoveryAction"] = (val if fv.nvmlReturn == 0 else err(fv.nvmlReturn)) if rc == 0 else err(rc)
        mx = ctypes.c_uint()
        rc = nvml.nvmlDeviceGetMaxMigDeviceCount(dev, ctypes.byref(mx))
        d["maxMigDeviceCount"] = mx.value if rc == 0 else err(rc)
        profiles = []
        for idx in range(32):
            info = ProfileInfoV3()
            info.version = ctypes.sizeof(ProfileInfoV3) | (3 << 24)
            rc = nvml.nvmlDeviceGetGpuInstanceProfileInfoV(dev, idx, ctypes.byref(info))
            if rc:
                profiles.append({"index": idx, **err(rc)})
                continue
            p = {"index": idx, "id": info.id, "name": info.name.decode(), "sliceCount": info.sliceCount,
                 "instanceCount": info.instanceCount, "multiprocessorCount": info.multiprocessorCount,
                 "copyEngineCount": info.copyEngineCount, "decoderCount": info.decoderCount,
                 "encoderCount": info.encoderCount, "jpegCount": info.jpegCount, "ofaCount": info.ofaCount,
                 "memorySizeMB": info.memorySizeMB, "capabilities": info.capabilities}
            buf = (Placement * 64)()
            cnt = ctypes.c_uint(64)
            rc = nvml.nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, info.id, buf, ctypes.byref(cnt))
            p["placements"] = [{"start": buf[k].start, "size": buf[k].size} for k in range(cnt.value)] if rc == 0 else err(rc)
            rem = ctypes.c_uint()
            rc = nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, info.id, ctypes.byref(rem))
            p["remainingCapacity"] = rem.value if rc == 0 else err(rc)
            profiles.append(p)
        d["gpuInstanceProfiles"] = profiles
        out["devices"].append(d)
    nvml.nvmlShutdown()
    json.dump(out, sys.stdout, indent=1)


main()
