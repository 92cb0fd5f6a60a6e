package memslice

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/gpu/police"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices/names"
)

type oneProc struct{ pid uint32 }

func (o oneProc) Processes(context.Context, string) ([]gpu.Process, error) {
	return []gpu.Process{{PID: o.pid, UsedBytes: 3 * gib}, {PID: 99999, UsedBytes: gib}}, nil
}

// listFixture is a node's state directory with GPU shares in its
// checkpoint, a /proc and a cgroupfs of its own.
type listFixture struct {
	state, proc, cgroup string
	pod                 types.UID
}

func newListFixture(t *testing.T) *listFixture {
	f := &listFixture{state: t.TempDir(), proc: t.TempDir(), cgroup: t.TempDir(), pod: "aaaaaaaa-0000-0000-0000-000000000001"}
	_ = os.MkdirAll(filepath.Join(f.proc, "4242"), 0o755)
	_ = os.WriteFile(filepath.Join(f.proc, "4242", "cgroup"), []byte("0::/kubepods/pod"+string(f.pod)+"/c\n"), 0o644)
	return f
}

func (f *listFixture) alloc(claim, share string) prepare.Allocation {
	sid := types.UID(share)
	return prepare.Allocation{ClaimUID: types.UID(claim), ClaimNamespace: "ns", ClaimName: claim, Request: "gpu", Device: "gpu-0000-19-00-0", Kind: names.KindGPU, ShareID: &sid}
}

func (f *listFixture) write(t *testing.T, claims map[types.UID]prepare.ClaimRecord, usage police.Usage) {
	t.Helper()
	cp, err := prepare.OpenCheckpoint(f.state, "boot-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.Update(func(c *prepare.Records) error {
		for k, v := range claims {
			c.Set(k, v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(usage)
	_ = os.MkdirAll(filepath.Join(f.state, SharesDir), 0o755)
	if err := os.WriteFile(filepath.Join(f.state, UsageFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// daemonRuns makes the claim's daemon of the GPU look alive: its pid file
// names a live process (this one) whose environment, in the fixture's
// /proc, carries the daemon's pipe directory.
func (f *listFixture) daemonRuns(t *testing.T, claim types.UID, uuid string) {
	d := mps.Daemon{Dir: DaemonDir(filepath.Join(f.state, SharesDir), claim, uuid), UUID: uuid}
	pid := strconv.Itoa(os.Getpid())
	_ = os.MkdirAll(d.PipeDir(), 0o755)
	_ = os.WriteFile(filepath.Join(d.PipeDir(), "nvidia-cuda-mps-control.pid"), []byte(pid+"\n"), 0o644)
	_ = os.MkdirAll(filepath.Join(f.proc, pid), 0o755)
	if err := os.WriteFile(filepath.Join(f.proc, pid, "environ"), []byte("CUDA_MPS_PIPE_DIRECTORY="+d.PipeDir()+"\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func record(tier Tier, slice uint64, region string) json.RawMessage {
	b, _ := json.Marshal(Record{Tier: tier, UUID: "GPU-1", Slice: slice, Region: region})
	return b
}

func TestListMPSPolicedShares(t *testing.T) {
	f := newListFixture(t)
	small, fresh := f.alloc("c1", "share-1"), f.alloc("c3", "share-3")
	nic := prepare.Allocation{ClaimUID: "c1", Request: "net", Device: "nic-x", Kind: names.KindNIC, ShareID: small.ShareID}
	f.write(t, map[types.UID]prepare.ClaimRecord{
		"c1": {UID: "c1", Namespace: "ns", Name: "c1", State: prepare.ClaimCompleted, Allocations: []prepare.Allocation{nic, small},
			Undo: []json.RawMessage{json.RawMessage(`{}`), record(TierMPSPoliced, 10*gib, "")}},
		"c2": {UID: "c2", Namespace: "ns", Name: "started", State: prepare.ClaimStarted, Allocations: []prepare.Allocation{f.alloc("c2", "share-2")}},
		"c3": {UID: "c3", Namespace: "ns", Name: "c3", State: prepare.ClaimCompleted, Allocations: []prepare.Allocation{fresh},
			Undo: []json.RawMessage{record(TierMPSPoliced, 5*gib, "")}},
	}, police.Usage{small.ShareKey(): {UsedBytes: 2 * gib, Processes: 1, Kills: 3, Pods: []types.UID{f.pod}}})
	opts := ListOptions{StateDir: f.state, BootID: "boot-1", ProcRoot: f.proc, LiveUnknown: "libnvidia-ml.so.1 not found"}

	// The daemon is not running: no share is enforced. Without NVML, used
	// is the agent's last reading, or unknown, saying why. The claim being
	// prepared is listed, not enforced.
	got, err := ListShares(context.Background(), opts)
	if err != nil || len(got) != 3 {
		t.Fatalf("ListShares = %+v, %v", got, err)
	}
	if st := got[0]; st.Claim != "ns/started" || st.Enforced || st.Problems[0] != "preparation not completed" || st.Used != nil {
		t.Errorf("a claim being prepared: %+v", st)
	}
	s, n := got[1], got[2]
	if s.Claim != "ns/c1" || s.ShareID != "share-1" || s.Device != "gpu-0000-19-00-0" || s.UUID != "GPU-1" || s.Slice != 10*gib || s.Tier != TierMPSPoliced || s.Kills != 3 {
		t.Errorf("share %+v", s)
	}
	if s.Used == nil || *s.Used != 2*gib || s.UsedFrom != UsedFromAgent || s.Processes != 1 {
		t.Errorf("used %v from %q", s.Used, s.UsedFrom)
	}
	if n.Used != nil || !strings.Contains(n.UsedUnknown, "libnvidia-ml.so.1 not found") {
		t.Errorf("a share nothing measured: used %v, %q", n.Used, n.UsedUnknown)
	}
	if s.Enforced || len(s.Problems) != 1 || !strings.Contains(s.Problems[0], "MPS control daemon of GPU-1 is not running (claim ns/c1's own") ||
		s.Daemon == nil || s.Daemon.Running || s.Daemon.PipeDir != filepath.Join(DaemonDir(filepath.Join(f.state, SharesDir), "c1", "GPU-1"), "pipe") {
		t.Errorf("without its daemon: enforced %v, %v", s.Enforced, s.Problems)
	}

	// c1's daemon runs; NVML measures the share's pod now (its process
	// 4242; 99999 is no pod's). c3's own daemon of the same GPU does not
	// run: c1's does not hold c3's share.
	f.daemonRuns(t, "c1", "GPU-1")
	opts.Live, opts.LiveUnknown = oneProc{pid: 4242}, ""
	got, err = ListShares(context.Background(), opts)
	if err != nil || len(got) != 3 {
		t.Fatalf("ListShares = %+v, %v", got, err)
	}
	got = got[1:]
	if s := got[0]; !s.Enforced || s.Used == nil || *s.Used != 3*gib || s.UsedFrom != UsedFromNVML || s.Processes != 1 {
		t.Errorf("live: %+v", s)
	}
	if s := got[0]; s.Daemon == nil || !s.Daemon.Running || s.Daemon.PID != os.Getpid() {
		t.Errorf("c1's daemon: %+v", s.Daemon)
	}
	if s := got[1]; s.Enforced || s.Daemon == nil || s.Daemon.Running || !strings.Contains(strings.Join(s.Problems, " "), "claim ns/c3") {
		t.Errorf("c3's share held by another claim's daemon: %+v", s)
	}
	if got[1].Used != nil || got[1].UsedUnknown == "" {
		t.Errorf("a share whose pods are not known was measured: %+v", got[1])
	}
	if got, _ := ListShares(context.Background(), ListOptions{StateDir: f.state, BootID: "boot-2"}); len(got) != 0 {
		t.Errorf("another boot's shares listed: %+v", got)
	}
}

// A dmem share is held where its hook wrote the slice: every recorded pod
// that still runs has it in dmem.max; used is the kernel's dmem.current.
func TestListDMEMShares(t *testing.T) {
	f := newListFixture(t)
	region := "nvidia/0000:19:00.0/vidmem"
	a := f.alloc("c1", "share-1")
	f.write(t, map[types.UID]prepare.ClaimRecord{"c1": {UID: "c1", Namespace: "ns", Name: "c1", State: prepare.ClaimCompleted,
		Allocations: []prepare.Allocation{a}, Undo: []json.RawMessage{record(TierDMEM, 10*gib, region)}}}, nil)
	opts := ListOptions{StateDir: f.state, BootID: "boot-1", ProcRoot: f.proc, CgroupRoot: f.cgroup}

	// No container started yet: nothing to hold, nothing used.
	got, err := ListShares(context.Background(), opts)
	if err != nil || len(got) != 1 || !got[0].Enforced || got[0].Used == nil || *got[0].Used != 0 || got[0].UsedFrom != UsedFromDmem {
		t.Fatalf("no container yet: %+v, %v", got, err)
	}
	pod := filepath.Join(f.cgroup, "kubepods.slice", "kubepods-pod"+string(f.pod)+".slice")
	_ = os.MkdirAll(pod, 0o755)
	_ = os.WriteFile(filepath.Join(pod, "dmem.max"), []byte(region+" 10737418240\n"), 0o644)
	_ = os.WriteFile(filepath.Join(pod, "dmem.current"), []byte(region+" 1048576\n"), 0o644)
	rec := RecordDir(filepath.Join(f.state, SharesDir), "GPU-1", a.ShareKey())
	_ = os.MkdirAll(rec, 0o755)
	rel, _ := filepath.Rel(f.cgroup, pod)
	_ = os.WriteFile(filepath.Join(rec, filepath.Base(pod)), []byte(rel+"\n"), 0o644)
	got, err = ListShares(context.Background(), opts)
	if err != nil || len(got) != 1 || !got[0].Enforced || *got[0].Used != 1<<20 {
		t.Fatalf("held: %+v, %v", got, err)
	}
	// The limit gone from the pod: not enforced.
	_ = os.WriteFile(filepath.Join(pod, "dmem.max"), nil, 0o644)
	got, err = ListShares(context.Background(), opts)
	if err != nil || len(got) != 1 || got[0].Enforced || len(got[0].Problems) != 1 || !strings.Contains(got[0].Problems[0], "dmem.max") {
		t.Fatalf("dmem.max missing: %+v, %v", got, err)
	}
}

// A share recorded on the node that the checkpoint does not hold (a lost
// or corrupt checkpoint, whose shares the agent adopted) is listed, marked
// adopted, with its daemon checked as any other's.
func TestListAdoptedShares(t *testing.T) {
	f := newListFixture(t)
	kept := f.alloc("c1", "share-1")
	f.write(t, map[types.UID]prepare.ClaimRecord{
		"c1": {UID: "c1", Namespace: "ns", Name: "c1", State: prepare.ClaimCompleted, Allocations: []prepare.Allocation{kept},
			Undo: []json.RawMessage{record(TierMPSPoliced, 10*gib, "")}},
	}, police.Usage{})
	dir := filepath.Join(f.state, SharesDir)
	lost := Request{Key: "c9/gpu/share-9", ClaimUID: "c9", Namespace: "ns", Name: "lost", ShareID: "share-9", UUID: "GPU-1", Slice: 4 * gib,
		Choice: Choice{Tier: TierMPSPoliced}}
	again := Request{Key: kept.ShareKey(), ClaimUID: "c1", Namespace: "ns", Name: "c1", ShareID: "share-1", UUID: "GPU-1", Slice: 10 * gib,
		Choice: Choice{Tier: TierMPSPoliced}}
	for _, r := range []Request{lost, again} {
		d := DaemonDir(dir, r.ClaimUID, r.UUID)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := writeShareFile(d, r); err != nil {
			t.Fatal(err)
		}
	}
	f.daemonRuns(t, "c9", "GPU-1")
	got, err := ListShares(context.Background(), ListOptions{StateDir: f.state, BootID: "boot-1", ProcRoot: f.proc})
	if err != nil || len(got) != 2 {
		t.Fatalf("ListShares = %+v, %v; want the checkpoint's share and the adopted one, each once", got, err)
	}
	a, k := got[1], got[0]
	if k.Claim != "ns/c1" || k.Adopted {
		t.Errorf("the checkpoint's share: %+v", k)
	}
	if a.Claim != "ns/lost" || !a.Adopted || a.ShareID != "share-9" || a.Slice != 4*gib || a.Tier != TierMPSPoliced || !a.Enforced || a.Daemon == nil || !a.Daemon.Running {
		t.Errorf("the adopted share: %+v", a)
	}
}
