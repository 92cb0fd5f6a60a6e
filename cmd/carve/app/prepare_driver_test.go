package app_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/carve-dra/carve/prepare"
)

func TestPrepareWritesCDIAndIsIdempotent(t *testing.T) {
	nic := &recorder{prepared: map[string]int{}, undone: map[string]int{}}
	e := newEnv(t, nic)
	c := claim("uid-1", "fpga-and-net", []result{
		{request: "fpga", device: "fpga-0000-3b-00-0"},
		{request: "net", device: "nic-0000-17-00-0", share: "share-a", consumed: bw("100M")},
	}, opaque(resourceapi.AllocationConfigSourceClass, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"FROM":"class"}}`),
		opaque(resourceapi.AllocationConfigSourceClaim, []string{"net"}, `{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"FROM":"claim","CLAIM_ONLY":"yes"}}`))

	first := e.prepare(c)["uid-1"]
	if first.Err != nil {
		t.Fatalf("prepare: %v", first.Err)
	}
	if len(first.Devices) != 2 || first.Devices[1].ShareID == nil || *first.Devices[1].ShareID != "share-a" {
		t.Fatalf("devices = %+v", first.Devices)
	}
	// The CDI library itself must find the devices we returned, with
	// the edits we promised.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(e.cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range first.Devices {
		dev := cache.GetDevice(d.CDIDeviceIDs[0])
		if dev == nil {
			t.Fatalf("CDI device %s not found; errors %v", d.CDIDeviceIDs[0], cache.GetErrors())
		}
		envs := strings.Join(dev.ContainerEdits.Env, " ")
		switch d.DeviceName {
		case "fpga-0000-3b-00-0":
			// The XRT card's management and user nodes, named as
			// the host sees them.
			var nodes []string
			for _, n := range dev.ContainerEdits.DeviceNodes {
				if n.HostPath != n.Path {
					t.Errorf("FPGA node %s has host path %s", n.Path, n.HostPath)
				}
				nodes = append(nodes, n.Path)
			}
			if want := "/dev/dri/card1 /dev/dri/renderD128 /dev/xclmgmt15104 /dev/xfpga/flash.m15104.0"; strings.Join(nodes, " ") != want {
				t.Errorf("FPGA device nodes = %v, want %s", nodes, want)
			}
			if !strings.Contains(envs, "FROM=class") {
				t.Errorf("FPGA env %q lacks the class config", envs)
			}
		case "nic-0000-17-00-0":
			// The claim adds to its class's environment; the
			// class (the admin's) wins where both set a variable.
			for _, want := range []string{"CARVE_NET_SHARE_ID=share-a", "CARVE_NET_EGRESSBANDWIDTH=100M", "CARVE_NET_PARENT=ens1f0np0", "FROM=class", "CLAIM_ONLY=yes"} {
				if !strings.Contains(envs, want) {
					t.Errorf("NIC env %q lacks %s", envs, want)
				}
			}
			if strings.Contains(envs, "FROM=claim") {
				t.Errorf("NIC env %q: the claim's config overrode the class's", envs)
			}
		}
		if len(dev.ContainerEdits.Mounts) != 1 || !strings.HasPrefix(dev.ContainerEdits.Mounts[0].ContainerPath, prepare.ClaimInfoDir) {
			t.Errorf("mounts = %+v", dev.ContainerEdits.Mounts)
		}
	}
	info, err := os.ReadFile(filepath.Join(e.state, "claims", "uid-1.json"))
	if err != nil || !strings.Contains(string(info), "share-a") {
		t.Errorf("claim info = %s, %v", info, err)
	}

	// Again, from a fresh driver as after a restart: same answer, nothing
	// prepared twice.
	e.driver = e.newDriver(nic)
	again := e.prepare(c)["uid-1"]
	if again.Err != nil || len(again.Devices) != 2 || again.Devices[0].CDIDeviceIDs[0] != first.Devices[0].CDIDeviceIDs[0] {
		t.Errorf("second prepare = %+v, want the first answer", again)
	}
	for k, n := range nic.prepared {
		if n != 1 {
			t.Errorf("%s prepared %d times", k, n)
		}
	}
	if recs := e.records(); recs["uid-1"].State != prepare.ClaimCompleted {
		t.Errorf("record = %+v", recs["uid-1"])
	}

	e.unprepare("uid-1")
	e.unprepare("uid-1") // unknown now: still fine
	if files := e.specFiles(); len(files) != 0 {
		t.Errorf("CDI specs left after unprepare: %v", files)
	}
	if _, err := os.Stat(filepath.Join(e.state, "claims", "uid-1.json")); !os.IsNotExist(err) {
		t.Errorf("claim info left after unprepare")
	}
	if len(e.records()) != 0 {
		t.Errorf("records left: %v", e.records())
	}
}

// A bad claim fails with a message naming what is wrong, and nothing of it
// is applied or recorded; other claims in the same call are unaffected.
func TestBadClaimsFailCleanly(t *testing.T) {
	e := newEnv(t, nil)
	// The DFL card's FME node, gone from /dev.
	if err := os.Remove(filepath.Join(e.root, "dev/dfl-fme.0")); err != nil {
		t.Fatal(err)
	}
	good := claim("good", "good", []result{{request: "llc", device: "llc-0"}})
	for _, tc := range []struct {
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{claim("u1", "unknown-device", []result{{request: "r", device: "gpu-0000-c1-00-0"}}), `"gpu-0000-c1-00-0"`},
		{claim("u2", "bad-config", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","interfaceName":"much-too-long-name"}`)), "interfaceName"},
		{claim("u3", "unknown-field", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClass, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","mtuu":1500}`)), "mtuu"},
		{claim("u4", "wrong-kind", []result{{request: "f", device: "fpga-0000-3b-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig"}`)), "not to a fpga device"},
		{claim("u5", "bad-env", []result{{request: "f", device: "fpga-0000-3b-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"1BAD":"x"}}`)), "env[1BAD]"},
		// What the preparers set, what changes the code a container
		// runs, control characters and carve's own interface prefix.
		{claim("u5b", "env-mps", []result{{request: "f", device: "fpga-0000-3b-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClass, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"CUDA_MPS_PIPE_DIRECTORY":"/tmp"}}`)), "CUDA_MPS_* variables are set by carve"},
		{claim("u5c", "env-nvidia", []result{{request: "f", device: "fpga-0000-3b-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"NVIDIA_VISIBLE_DEVICES":"all"}}`)), "NVIDIA_* variables are set by carve"},
		{claim("u5d", "env-ld", []result{{request: "f", device: "fpga-0000-3b-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"LD_PRELOAD":"/x.so"}}`)), "env[LD_PRELOAD]: Forbidden: LD_* variables may be set by the DeviceClass"},
		{claim("u5e", "env-control", []result{{request: "f", device: "fpga-0000-3b-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig","env":{"A":"x\ry"}}`)), "control characters are not allowed"},
		{claim("u5f", "ifname-cr", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","interfaceName":"net\u000b1"}`)), "control characters"},
		{claim("u5g", "ifname-cv", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","interfaceName":"cv1234"}`)), "carve's prefix"},
		// Pools belong to classes: a claim chooses among its class's.
		{claim("u5h", "foreign-pool", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClass, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["tenant-a"]}`),
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["tenant-b"]}`)), `pool "tenant-b" is not one the DeviceClass allows (tenant-a)`},
		{claim("u5i", "pool-of-no-class", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","pools":["tenant-b"]}`)), `pool "tenant-b": the DeviceClass allows its claims no address pool`},
		{claim("u5j", "claim-allowed-pools", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","allowedPools":["tenant-b"]}`)), "parameters.allowedPools: Forbidden: set by the DeviceClass"},
		{claim("u6", "over-capacity", []result{{request: "net", device: "nic-0000-17-00-0", share: "s1", consumed: bw("30G")}}), "exceeds its capacity"},
		{claim("u7", "missing-node", []result{{request: "f", device: "fpga-0000-5e-00-0"}}), "dfl-fme.0"},
		// What touches the physical network is the admin's (the class's).
		{claim("u8", "claim-vlan", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","vlan":100}`)), "parameters.vlan: Forbidden: set by the DeviceClass"},
		{claim("u9", "claim-address", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","addresses":["10.0.0.1/24"]}`)), "parameters.addresses: Forbidden"},
		{claim("u10", "claim-route", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","routes":[{"destination":"default","gateway":"10.0.0.1"}]}`)), "parameters.routes: Forbidden"},
		{claim("u11a", "claim-ethertypes", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","ethertypes":["0x88F7"]}`)), "parameters.ethertypes: Forbidden: set by the DeviceClass"},
		{claim("u11b", "claim-router", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","allowRouterAdvertisements":true}`)), "parameters.allowRouterAdvertisements: Forbidden: set by the DeviceClass"},
		{claim("u11", "claim-mode", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","macvlanMode":"private"}`)), "parameters.macvlanMode: Forbidden"},
		// Passthru gives one pod the whole NIC: never a share, not even
		// from the admin.
		{claim("u12", "passthru", []result{{request: "net", device: "nic-0000-17-00-0"}},
			opaque(resourceapi.AllocationConfigSourceClass, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","macvlanMode":"passthru"}`)), "macvlanMode: Unsupported value"},
	} {
		res := e.prepare(tc.claim, good)
		err := res[tc.claim.UID].Err
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one mentioning %s", tc.claim.Name, err, tc.want)
		}
		if res["good"].Err != nil {
			t.Errorf("%s: the good claim failed too: %v", tc.claim.Name, res["good"].Err)
		}
		if _, ok := e.records()[tc.claim.UID]; ok {
			t.Errorf("%s: failed claim recorded", tc.claim.Name)
		}
		if _, err := os.Stat(filepath.Join(e.state, "claims", string(tc.claim.UID)+".json")); !os.IsNotExist(err) {
			t.Errorf("%s: claim info written for a failed claim", tc.claim.Name)
		}
	}
	if files := e.specFiles(); len(files) != 1 {
		t.Errorf("CDI specs = %v, want only the good claim's", files)
	}
}

// A share over its device's capacity waits, up to ConflictWait, for the
// claim whose record holds the capacity to be unprepared: the scheduler
// gives the capacity away as soon as the old claim's allocation is gone,
// and the kubelet unprepares the old claim on its own time, often just
// after (on the real node, a refused prepare cost the new pod the kubelet's
// 74 s retry backoff). A claim that does not leave is refused once the
// wait is over.
func TestPrepareWaitsForALeavingClaim(t *testing.T) {
	e := newEnv(t, nil)
	e.conflictWait = time.Minute
	e.driver = e.newDriver(nil)
	a := claim("a", "a", []result{{request: "net", device: "nic-0000-17-00-0", share: "s-a", consumed: bw("20G")}})
	b := claim("b", "b", []result{{request: "net", device: "nic-0000-17-00-0", share: "s-b", consumed: bw("5G")}})
	c := claim("c", "c", []result{{request: "net", device: "nic-0000-17-00-0", share: "s-c", consumed: bw("1G")}})
	if res := e.prepare(a, b); res["a"].Err != nil || res["b"].Err != nil {
		t.Fatalf("a, b = %v, %v", res["a"].Err, res["b"].Err)
	}
	// b's unprepare comes while c waits; the kubelet calls each claim on
	// its own, so c's wait holds nothing b's unprepare needs.
	left := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		res, err := e.driver.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "b"}})
		left <- errors.Join(err, res["b"])
	}()
	if res := e.prepare(c); res["c"].Err != nil {
		t.Errorf("c, while b was leaving: %v", res["c"].Err)
	}
	if err := <-left; err != nil {
		t.Fatalf("unprepare b: %v", err)
	}
	if _, ok := e.records()["b"]; ok {
		t.Fatal("b is still recorded: c was prepared beside it, over the capacity")
	}

	e.conflictWait = 200 * time.Millisecond
	e.driver = e.newDriver(nil)
	d := claim("d", "d", []result{{request: "net", device: "nic-0000-17-00-0", share: "s-d", consumed: bw("5G")}})
	if res := e.prepare(d); res["d"].Err == nil || !strings.Contains(res["d"].Err.Error(), "exceeds its capacity") {
		t.Errorf("d beside a and c, which stay = %v, want over capacity", res["d"].Err)
	}
	if _, ok := e.records()["d"]; ok {
		t.Error("refused d recorded")
	}
}

// Shares of one NIC are accepted up to its capacity; a device given whole
// is not given again.
func TestSharesAndExclusivity(t *testing.T) {
	e := newEnv(t, nil)
	a := claim("a", "a", []result{{request: "net", device: "nic-0000-17-00-0", share: "s-a", consumed: bw("20G")}})
	b := claim("b", "b", []result{{request: "net", device: "nic-0000-17-00-0", share: "s-b", consumed: bw("5G")}})
	c := claim("c", "c", []result{{request: "net", device: "nic-0000-17-00-0", share: "s-c", consumed: bw("1G")}})
	res := e.prepare(a, b, c)
	if res["a"].Err != nil || res["b"].Err != nil {
		t.Fatalf("a, b = %v, %v", res["a"].Err, res["b"].Err)
	}
	if res["c"].Err == nil || !strings.Contains(res["c"].Err.Error(), "exceeds") {
		t.Errorf("c = %v, want over capacity (25G in use)", res["c"].Err)
	}
	e.unprepare("b")
	if res := e.prepare(c); res["c"].Err != nil {
		t.Errorf("c after b left: %v", res["c"].Err)
	}
	whole1 := claim("w1", "w1", []result{{request: "f", device: "fpga-0000-3b-00-0"}})
	whole2 := claim("w2", "w2", []result{{request: "f", device: "fpga-0000-3b-00-0"}})
	res = e.prepare(whole1)
	if res["w1"].Err != nil {
		t.Fatal(res["w1"].Err)
	}
	if res := e.prepare(whole2); res["w2"].Err == nil || !strings.Contains(res["w2"].Err.Error(), "already prepared") {
		t.Errorf("second whole allocation = %v, want refused", res["w2"].Err)
	}
}

// A claim left "started" by a crash is rolled back and prepared again.
func TestStartedClaimIsRolledBackAndRedone(t *testing.T) {
	nic := &recorder{prepared: map[string]int{}, undone: map[string]int{}}
	e := newEnv(t, nic)
	c := claim("s", "s", []result{{request: "net", device: "nic-0000-17-00-0", share: "s-1", consumed: bw("1G")}})
	// What a crash after phase 1 leaves behind.
	if err := e.cp.Update(func(recs *prepare.Records) error {
		recs.Set("s", prepare.ClaimRecord{UID: "s", Namespace: "default", Name: "s", State: prepare.ClaimStarted,
			Allocations: []prepare.Allocation{{ClaimUID: "s", Request: "net", Device: "nic-0000-17-00-0", Kind: "nic", ShareID: ptr.To(types.UID("s-1"))}}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if res := e.prepare(c); res["s"].Err != nil {
		t.Fatal(res["s"].Err)
	}
	key := "s/net/s-1"
	if nic.undone[key] != 1 || nic.prepared[key] != 1 {
		t.Errorf("undone %d, prepared %d; want the started claim rolled back once and prepared once", nic.undone[key], nic.prepared[key])
	}
	if e.records()["s"].State != prepare.ClaimCompleted {
		t.Errorf("record = %+v", e.records()["s"])
	}
}

// A preparer failing halfway undoes the devices already prepared.
func TestPreparerFailureRollsBack(t *testing.T) {
	nic := &recorder{prepared: map[string]int{}, undone: map[string]int{}, failOn: "nic-0000-00-03-0"}
	e := newEnv(t, nic)
	c := claim("f", "f", []result{
		{request: "a", device: "nic-0000-17-00-0", share: "s-1", consumed: bw("1G")},
		{request: "b", device: "nic-0000-00-03-0", share: "s-2", consumed: bw("1M")},
	})
	res := e.prepare(c)
	if res["f"].Err == nil || !strings.Contains(res["f"].Err.Error(), "nic-0000-00-03-0") {
		t.Fatalf("err = %v", res["f"].Err)
	}
	if nic.undone["f/a/s-1"] != 1 {
		t.Errorf("first device not undone: %v", nic.undone)
	}
	if len(e.records()) != 0 || len(e.specFiles()) != 0 {
		t.Errorf("records %v, specs %v left after a failed prepare", e.records(), e.specFiles())
	}
}

// Many claims prepared and unprepared at once, as when many pods start
// together: every one succeeds, none is lost from the checkpoint, and shares
// beyond the NIC's capacity are refused.
func TestConcurrentClaims(t *testing.T) {
	e := newEnv(t, nil)
	const n = 60 // 60 shares of 500M on a 25G NIC: 50 fit
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			uid := fmt.Sprintf("c-%d", i)
			c := claim(uid, uid, []result{{request: "net", device: "nic-0000-17-00-0", share: "s-" + uid, consumed: bw("500M")}})
			res, err := e.driver.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
			if err != nil {
				errs[i] = err
				return
			}
			errs[i] = res[types.UID(uid)].Err
		}(i)
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
		} else if !strings.Contains(err.Error(), "exceeds its capacity") {
			t.Errorf("unexpected error: %v", err)
		}
	}
	if ok != 50 || len(e.records()) != 50 || len(e.specFiles()) != 50 {
		t.Errorf("%d prepared, %d records, %d specs; want 50 each", ok, len(e.records()), len(e.specFiles()))
	}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			e.unprepare(fmt.Sprintf("c-%d", i))
		}(i)
	}
	wg.Wait()
	if len(e.records()) != 0 || len(e.specFiles()) != 0 {
		t.Errorf("left after unprepare: %d records, %d specs", len(e.records()), len(e.specFiles()))
	}
}

// A failed preparation whose undo fails too keeps its record as started, so
// the next attempt rolls it back before preparing again: nothing is lost.
func TestFailedUndoKeepsTheRecord(t *testing.T) {
	nic := &recorder{prepared: map[string]int{}, undone: map[string]int{}, failOn: "nic-0000-17-00-0", failUndo: true}
	e := newEnv(t, nic)
	c := claim("u", "u", []result{{request: "net", device: "nic-0000-17-00-0", share: "s", consumed: bw("1G")}})
	if res := e.prepare(c); res["u"].Err == nil {
		t.Fatal("prepare succeeded though the preparer failed")
	}
	if rec, ok := e.records()["u"]; !ok || rec.State != prepare.ClaimStarted {
		t.Fatalf("record after a failed undo = %+v, %v; want it kept as started", rec, ok)
	}
	nic.mu.Lock()
	nic.failOn, nic.failUndo = "", false
	nic.mu.Unlock()
	if res := e.prepare(c); res["u"].Err != nil {
		t.Fatalf("retry: %v", res["u"].Err)
	}
	if rec := e.records()["u"]; rec.State != prepare.ClaimCompleted {
		t.Errorf("record after retry = %+v", rec)
	}
	if n := nic.undone["u/net/s"]; n < 2 {
		t.Errorf("undone %d times; want the failed undo retried before preparing again", n)
	}
}
