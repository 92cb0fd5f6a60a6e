#!/usr/bin/env python3
"""A pod's process for carve's acceptance run: allocates GiB on cuda:0 and
holds it, or computes matrix products in a loop, reporting to a JSON file.

  client.py --report FILE --alloc-gib N [--hold S] [--compute]
"""
import argparse, json, os, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--report", required=True)
ap.add_argument("--alloc-gib", type=float, required=True)
ap.add_argument("--hold", type=float, default=3.0)
ap.add_argument("--compute", action="store_true")
a = ap.parse_args()

def report(**kw):
    kw["pid"] = os.getpid()
    tmp = a.report + ".tmp"
    with open(tmp, "w") as f:
        json.dump(kw, f)
    os.replace(tmp, a.report)

import torch
try:
    torch.cuda.init()
    x = torch.empty(int(a.alloc_gib * (1 << 30)), dtype=torch.uint8, device="cuda:0")
    x.fill_(1)
    torch.cuda.synchronize()
except Exception as e:  # refused: out of memory, or no context at all
    report(state="refused", error=str(e)[:300])
    sys.exit(3)
report(state="allocated")
if not a.compute:
    time.sleep(a.hold)
    report(state="done")
    sys.exit(0)
m = torch.randn(2048, 2048, device="cuda:0")
beats = 0
deadline = time.time() + a.hold
while time.time() < deadline:
    try:
        m = (m @ m).tanh_()
        torch.cuda.synchronize()
    except Exception as e:
        report(state="faulted", beats=beats, error=str(e)[:300])
        sys.exit(4)
    beats += 1
    if beats % 50 == 0:
        report(state="computing", beats=beats)
report(state="done", beats=beats)
