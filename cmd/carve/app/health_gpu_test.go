package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/discovery/nvmlinfo/nvmltest"
	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/nvmlreplay"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// gpuHealthRig is an agent's health over a replayed 8 x H100 node (GPU 2
// with MIG on), its GPU source watching the replay's events.
type gpuHealthRig struct {
	replay *nvmlreplay.Replay
	h      *deviceHealth
	res    slices.Result
}

func newGPUHealthRig(t *testing.T, holdDown string, events ...nvmlinfo.Event) *gpuHealthRig {
	t.Helper()
	inv := nvmltest.H100Node(2)
	inv.Events = events
	r, err := nvmlreplay.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := gpu.Open(ctx, r.Library(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	nv, err := s.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := nodeconfig.Default()
	cfg.Health.HoldDown = holdDown
	res := slices.Build(&discovery.Inventory{NVML: nv}, cfg, "node-a")
	h := newDeviceHealth(cfg, "node-a", t.TempDir(), "/", nil)
	go h.tracker.Run(ctx)
	src := &gpu.HealthSource{NVML: s.Lane(), Devices: func() map[string]slices.Entry { return res.Index }, Wait: 100 * time.Millisecond, Poll: 200 * time.Millisecond}
	go func() { _ = src.Run(ctx, h.tracker) }()
	return &gpuHealthRig{replay: r, h: h, res: res}
}

// taints are the published devices' taints by GPU UUID, only those tainted.
func (g *gpuHealthRig) taints() map[string][]resourceapi.DeviceTaint {
	out := map[string][]resourceapi.DeviceTaint{}
	pub := g.h.publishable(g.res.Resources)
	for _, pool := range pub.Pools {
		for _, s := range pool.Slices {
			for _, d := range s.Devices {
				if len(d.Taints) > 0 {
					out[g.res.Index[d.Name].GPU.Device.UUID] = append(out[g.res.Index[d.Name].GPU.Device.UUID], d.Taints...)
				}
			}
		}
	}
	return out
}

func waitTaint(t *testing.T, g *gpuHealthRig, within time.Duration, cond func(map[string][]resourceapi.DeviceTaint) bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond(g.taints()) {
		if time.Since(start) > within {
			t.Fatalf("after %v: taints %v", within, g.taints())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// A fatal XID taints its GPU, only it, within 1 s; a benign one does not; the
// taint clears after the hold-down.
func TestGPUXIDTaints(t *testing.T) {
	g := newGPUHealthRig(t, "1s")
	time.Sleep(300 * time.Millisecond) // the event set is registered
	g.replay.Inject(nvmlinfo.Event{UUID: nvmltest.H100UUID(0), Type: nvmlinfo.EventXID, XID: 13})
	g.replay.Inject(nvmlinfo.Event{UUID: nvmltest.H100UUID(0), Type: nvmlinfo.EventXID, XID: 43})
	time.Sleep(500 * time.Millisecond)
	if ts := g.taints(); len(ts) != 0 {
		t.Fatalf("benign XIDs 13 and 43 tainted: %v", ts)
	}
	// Each on a GPU of its own: failing again right after a clear is a
	// flap, whose hold-down doubles.
	for i, xid := range []uint64{48, 63, 64, 74, 92, 94, 95} {
		uuid := nvmltest.H100UUID([]int{3, 4, 5, 6, 7, 0, 1}[i])
		g.replay.Inject(nvmlinfo.Event{UUID: uuid, Type: nvmlinfo.EventXID, XID: xid})
		took := waitTaint(t, g, time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts[uuid]) == 1 })
		ts := g.taints()
		if len(ts) != 1 || ts[uuid][0].Effect != resourceapi.DeviceTaintEffectNoSchedule || ts[uuid][0].Value != fmt.Sprintf("XID%d", xid) {
			t.Fatalf("XID %d: taints %v, want %s alone, XID%d:NoSchedule", xid, ts, uuid, xid)
		}
		t.Logf("XID %d to taint: %v", xid, took)
		took = waitTaint(t, g, 5*time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts) == 0 })
		if took < 900*time.Millisecond {
			t.Errorf("XID %d: cleared %v later, before the 1 s hold-down", xid, took)
		}
	}
	// XID 79, off the bus: lost, NoExecute, on every device of the GPU (GPU
	// 2's MIG placements too).
	g.replay.Inject(nvmlinfo.Event{UUID: nvmltest.H100UUID(2), Type: nvmlinfo.EventXID, XID: 79})
	took := waitTaint(t, g, time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts[nvmltest.H100UUID(2)]) > 0 })
	n := 0
	for _, e := range g.res.Index {
		if e.GPU != nil && e.GPU.Device.UUID == nvmltest.H100UUID(2) {
			n++
		}
	}
	ts := g.taints()
	if len(ts) != 1 || len(ts[nvmltest.H100UUID(2)]) != n || ts[nvmltest.H100UUID(2)][0].Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Fatalf("XID 79: taints %v, want all %d devices of GPU 2, NoExecute", ts, n)
	}
	t.Logf("XID 79 to taint of GPU 2's %d devices: %v", n, took)
}

// GPU_IS_LOST taints NoExecute as long as NVML answers it; recovered, the
// taint clears after the hold-down. Row remaps pending taint NoSchedule; so
// does a double-bit ECC error, from the replay file's own timeline.
func TestGPULostTaints(t *testing.T) {
	g := newGPUHealthRig(t, "1s",
		nvmlinfo.Event{AfterMs: 400, UUID: nvmltest.H100UUID(5), Type: nvmlinfo.EventDoubleBitECC},
		nvmlinfo.Event{AfterMs: 400, UUID: nvmltest.H100UUID(6), Type: nvmlinfo.EventRowRemapPending})
	loaded := time.Now()
	took := waitTaint(t, g, 2*time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool {
		return len(ts[nvmltest.H100UUID(5)]) == 1 && len(ts[nvmltest.H100UUID(6)]) == 1
	})
	ts := g.taints()
	if ts[nvmltest.H100UUID(5)][0].Value != gpu.ReasonECCDoubleBit || ts[nvmltest.H100UUID(6)][0].Value != gpu.ReasonRowRemapPending {
		t.Fatalf("taints %v", ts)
	}
	t.Logf("double-bit ECC and row remap pending to taint: %v after the replay's 400 ms", loaded.Add(took).Sub(loaded.Add(400*time.Millisecond)))

	g.replay.Inject(nvmlinfo.Event{UUID: nvmltest.H100UUID(1), Type: nvmlinfo.EventGPULost})
	took = waitTaint(t, g, time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts[nvmltest.H100UUID(1)]) == 1 })
	ts = g.taints()
	if lost := ts[nvmltest.H100UUID(1)][0]; lost.Value != gpu.ReasonGPULost || lost.Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Fatalf("GPU 1 lost: taint %+v, want GPULost NoExecute", lost)
	}
	t.Logf("GPU_IS_LOST to taint: %v", took)
	time.Sleep(1500 * time.Millisecond) // past the hold-down: still lost
	if len(g.taints()[nvmltest.H100UUID(1)]) != 1 {
		t.Fatal("GPU 1's taint cleared while NVML still answers GPU_IS_LOST")
	}
	g.replay.Inject(nvmlinfo.Event{UUID: nvmltest.H100UUID(1), Type: nvmlinfo.EventRecovered})
	back := time.Now()
	waitTaint(t, g, 5*time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts[nvmltest.H100UUID(1)]) == 0 })
	if d := time.Since(back); d < time.Second {
		t.Errorf("GPU 1's taint cleared %v after it recovered, before the 1 s hold-down", d)
	} else {
		t.Logf("GPU 1 recovered to taint cleared: %v", d)
	}
}
