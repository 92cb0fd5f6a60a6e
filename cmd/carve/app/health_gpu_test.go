package app

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
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
	return newGPUHealthRigOf(t, inv, holdDown, 100*time.Millisecond, 200*time.Millisecond, nil)
}

// newGPUHealthRigOf is newGPUHealthRig over inv, its GPU source waiting
// wait for events and probing every poll (0: the agent's defaults).
func newGPUHealthRigOf(t *testing.T, inv *nvmlinfo.Inventory, holdDown string, wait, poll time.Duration, wedged func(string) error) *gpuHealthRig {
	t.Helper()
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
	src := &gpu.HealthSource{NVML: s.Lane(), Devices: func() map[string]slices.Entry { return res.Index }, Wait: wait, Poll: poll, Wedged: wedged}
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
	for _, xid := range []uint64{13, 31, 43, 45, 68} {
		g.replay.Inject(nvmlinfo.Event{UUID: nvmltest.H100UUID(0), Type: nvmlinfo.EventXID, XID: xid})
	}
	time.Sleep(500 * time.Millisecond)
	if ts := g.taints(); len(ts) != 0 {
		t.Fatalf("an application's XIDs (13, 31, 43, 45, 68) tainted: %v", ts)
	}
	// Every other XID taints, listed or not (119 and 120: GSP timeouts,
	// common on Hopper; 154 and 999: not in carve's table). Each on a GPU
	// of its own: failing again right after a clear is a flap, whose
	// hold-down doubles.
	for i, xid := range []uint64{48, 63, 64, 74, 92, 94, 95, 119, 120, 61, 154, 999} {
		uuid := nvmltest.H100UUID([]int{3, 4, 5, 6, 7, 0, 1, 3, 4, 5, 6, 7}[i])
		if i == 7 {
			// The first GPUs again: past their flap window.
			time.Sleep(2 * time.Second)
		}
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

// A lost GPU costs the health loop a few NVML calls a second, not a core:
// a real driver answers every wait of an event set holding a lost GPU with
// GPU_IS_LOST at once (the replay too), and a loop that waits again at once
// made 114,521 waits in 500 ms. The other GPUs stay published and watched.
// The agent's own wait and poll (500 ms, 5 s).
func TestGPULostCostsFewCalls(t *testing.T) {
	g := newGPUHealthRigOf(t, nvmltest.H100Node(2), "1s", 0, 0, nil)
	time.Sleep(300 * time.Millisecond) // the event set is registered
	lostUUID := nvmltest.H100UUID(1)
	g.replay.Inject(nvmlinfo.Event{UUID: lostUUID, Type: nvmlinfo.EventGPULost})
	waitTaint(t, g, 2*time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts[lostUUID]) == 1 })
	before, start := g.replay.Calls(), time.Now()
	time.Sleep(6 * time.Second) // past one probe of every GPU
	calls, took := g.replay.Calls()-before, time.Since(start)
	perSecond := float64(calls) / took.Seconds()
	t.Logf("GPU 1 lost: %d NVML health calls in %v (%.1f a second)", calls, took.Round(time.Millisecond), perSecond)
	if perSecond > 10 {
		t.Errorf("a lost GPU cost %.1f NVML calls a second, want at most 10", perSecond)
	}
	ts := g.taints()
	if len(ts) != 1 || ts[lostUUID][0].Value != gpu.ReasonGPULost {
		t.Fatalf("taints %v, want GPU 1's GPULost alone", ts)
	}
	published := 0
	for _, pool := range g.h.publishable(g.res.Resources).Pools {
		for _, s := range pool.Slices {
			published += len(s.Devices)
		}
	}
	if published != len(g.res.Index) {
		t.Errorf("%d devices published with GPU 1 lost, want all %d (its own tainted)", published, len(g.res.Index))
	}
	// The other GPUs' events still arrive.
	g.replay.Inject(nvmlinfo.Event{UUID: nvmltest.H100UUID(4), Type: nvmlinfo.EventXID, XID: 119})
	waitTaint(t, g, 2*time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts[nvmltest.H100UUID(4)]) == 1 })
	// Back, it is watched again: its own XID taints it after the loss clears.
	g.replay.Inject(nvmlinfo.Event{UUID: lostUUID, Type: nvmlinfo.EventRecovered})
	waitTaint(t, g, 10*time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts[lostUUID]) == 0 })
	g.replay.Inject(nvmlinfo.Event{UUID: lostUUID, Type: nvmlinfo.EventXID, XID: 48})
	waitTaint(t, g, 2*time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool {
		return len(ts[lostUUID]) == 1 && ts[lostUUID][0].Value == "XID48"
	})
}

// An XID of one MIG instance taints the devices that share its slices, not
// the rest of the card: one tenant's contained fault is not its neighbours'.
// An XID of the whole GPU still taints every device of it.
func TestGPUMIGXIDTaintsItsInstance(t *testing.T) {
	g := newGPUHealthRigOf(t, nvmltest.H100Node(2), "1s", 100*time.Millisecond, 200*time.Millisecond, nil)
	time.Sleep(300 * time.Millisecond)
	migUUID := nvmltest.H100UUID(2)
	id := makeInstance(t, g.replay, 2, 2, 4) // 3g.40gb at slices 4-7, as a claim's prepare makes it
	g.replay.Inject(nvmlinfo.Event{UUID: migUUID, Type: nvmlinfo.EventXID, XID: 94, GPUInstance: &id})
	waitTaint(t, g, 2*time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts[migUUID]) > 0 })
	tainted, clean := 0, 0
	for _, pool := range g.h.publishable(g.res.Resources).Pools {
		for _, s := range pool.Slices {
			for _, d := range s.Devices {
				e := g.res.Index[d.Name]
				if e.GPU == nil || e.GPU.Device.UUID != migUUID {
					continue
				}
				overlaps := e.GPU.MIG != nil && e.GPU.MIG.Placement.Start < 8 && 4 < e.GPU.MIG.Placement.Start+e.GPU.MIG.Placement.Size
				switch {
				case overlaps && len(d.Taints) == 0:
					t.Errorf("%s (slices %d+%d) shares the instance's slices and is not tainted", d.Name, e.GPU.MIG.Placement.Start, e.GPU.MIG.Placement.Size)
				case !overlaps && len(d.Taints) > 0:
					t.Errorf("%s is tainted %v by another instance's XID", d.Name, d.Taints)
				case overlaps:
					tainted++
				default:
					clean++
				}
			}
		}
	}
	t.Logf("MIG XID 94 of GPU instance %d (slices 4-7): %d devices tainted, %d not", id, tainted, clean)
	if tainted == 0 || clean == 0 {
		t.Fatalf("%d tainted, %d clean: want both", tainted, clean)
	}
	waitTaint(t, g, 5*time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts) == 0 })
	time.Sleep(2 * time.Second) // past the flap window
	g.replay.Inject(nvmlinfo.Event{UUID: migUUID, Type: nvmlinfo.EventXID, XID: 94})
	n := 0
	for _, e := range g.res.Index {
		if e.GPU != nil && e.GPU.Device.UUID == migUUID {
			n++
		}
	}
	waitTaint(t, g, 2*time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts[migUUID]) == n })
}

// makeInstance makes a GPU instance of the profile at NVML's profile index
// at slice start on GPU index, and returns the id NVML gives it.
func makeInstance(t *testing.T, r *nvmlreplay.Replay, index, profile, start int) uint32 {
	t.Helper()
	dev, ret := r.Server.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		t.Fatal(nvml.ErrorString(ret))
	}
	info, ret := dev.GetGpuInstanceProfileInfo(profile)
	if ret != nvml.SUCCESS {
		t.Fatal(nvml.ErrorString(ret))
	}
	placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
	if ret != nvml.SUCCESS {
		t.Fatal(nvml.ErrorString(ret))
	}
	var gi nvml.GpuInstance
	ret = nvml.ERROR_INVALID_ARGUMENT
	for _, pl := range placements {
		if int(pl.Start) == start {
			gi, ret = dev.CreateGpuInstanceWithPlacement(&info, &pl)
		}
	}
	if ret != nvml.SUCCESS {
		t.Fatalf("GPU instance of profile index %d at %d: %s", profile, start, nvml.ErrorString(ret))
	}
	gii, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		t.Fatal(nvml.ErrorString(ret))
	}
	return gii.Id
}

// A GPU whose policing lane is wedged (a process query hung in the driver)
// is degraded while it lasts: its shares are no longer held to their
// slices. The others are not.
func TestGPUWedgedLaneTaints(t *testing.T) {
	var mu sync.Mutex
	hung := map[string]bool{}
	wedged := func(uuid string) error {
		mu.Lock()
		defer mu.Unlock()
		if hung[uuid] {
			return fmt.Errorf("GPU %s: NVML processes did not return within 10s", uuid)
		}
		return nil
	}
	g := newGPUHealthRigOf(t, nvmltest.H100Node(), "1s", 100*time.Millisecond, 200*time.Millisecond, wedged)
	mu.Lock()
	hung[nvmltest.H100UUID(3)] = true
	mu.Unlock()
	waitTaint(t, g, time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts[nvmltest.H100UUID(3)]) == 1 })
	ts := g.taints()
	if len(ts) != 1 || ts[nvmltest.H100UUID(3)][0].Value != gpu.ReasonNVMLHung || ts[nvmltest.H100UUID(3)][0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Fatalf("taints %v, want GPU 3's NVMLHung:NoSchedule alone", ts)
	}
	mu.Lock()
	delete(hung, nvmltest.H100UUID(3))
	mu.Unlock()
	waitTaint(t, g, 5*time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts) == 0 })
}

// A recovery action the driver asks (r570 on) taints its GPU for as long as
// NVML still answers it, not only at its event: a reset or a drain
// NoSchedule, a reboot NoExecute. A reset clears it after the hold-down.
func TestGPURecoveryActionTaints(t *testing.T) {
	g := newGPUHealthRig(t, "1s")
	time.Sleep(300 * time.Millisecond) // the event set is registered
	action := func(a uint32) *uint32 { return &a }
	resetGPU, rebootGPU := nvmltest.H100UUID(3), nvmltest.H100UUID(4)
	g.replay.Inject(nvmlinfo.Event{UUID: resetGPU, Type: nvmlinfo.EventRecoveryAction, RecoveryAction: action(uint32(nvml.GPU_RECOVERY_ACTION_GPU_RESET))})
	g.replay.Inject(nvmlinfo.Event{UUID: rebootGPU, Type: nvmlinfo.EventRecoveryAction, RecoveryAction: action(uint32(nvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT))})
	took := waitTaint(t, g, time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool {
		return len(ts[resetGPU]) == 1 && len(ts[rebootGPU]) == 1
	})
	t.Logf("recovery actions to taints: %v", took)
	check := func(when string) {
		t.Helper()
		ts := g.taints()
		if len(ts) != 2 {
			t.Fatalf("%s: taints %v, want GPUs 3 and 4 alone", when, ts)
		}
		if r := ts[resetGPU][0]; r.Value != gpu.ReasonRecoveryReset || r.Effect != resourceapi.DeviceTaintEffectNoSchedule {
			t.Fatalf("%s: GPU 3 asked a reset: taint %+v, want RecoveryReset NoSchedule", when, r)
		}
		if r := ts[rebootGPU][0]; r.Value != gpu.ReasonRecoveryReboot || r.Effect != resourceapi.DeviceTaintEffectNoExecute {
			t.Fatalf("%s: GPU 4 asked a reboot: taint %+v, want RecoveryReboot NoExecute", when, r)
		}
	}
	check("at once")
	// Past the hold-down the events' moments are over; the field still
	// answers the actions, so the taints stay.
	time.Sleep(2 * time.Second)
	check("after the hold-down")
	g.replay.Inject(nvmlinfo.Event{UUID: resetGPU, Type: nvmlinfo.EventRecovered})
	back := time.Now()
	waitTaint(t, g, 5*time.Second, func(ts map[string][]resourceapi.DeviceTaint) bool { return len(ts[resetGPU]) == 0 })
	if d := time.Since(back); d < time.Second {
		t.Errorf("GPU 3's taint cleared %v after its reset, before the 1 s hold-down", d)
	}
	if ts := g.taints(); len(ts) != 1 || len(ts[rebootGPU]) != 1 {
		t.Fatalf("after GPU 3's reset: taints %v, want GPU 4's alone", ts)
	}
}
