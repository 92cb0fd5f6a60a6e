package app_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/prepare"
	carvecdi "github.com/carve-dra/carve/prepare/cdi"
	"github.com/carve-dra/carve/prepare/fpga"
	"github.com/carve-dra/carve/prepare/llc"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// The driver under test, with fixture devices and fake or recording
// preparers, and helpers to build claims the way the scheduler allocates them.

const driverName = "carve.dev"

type env struct {
	t       *testing.T
	root    string
	state   string
	cdiDir  string
	driver  *prepare.Driver
	devices map[string]slices.Entry
	cp      *prepare.Checkpoint
	// conflictWait is the drivers' ConflictWait; 0 fails at once.
	conflictWait time.Duration
}

// recorder is a preparer that counts calls, so tests can see that nothing is
// prepared twice, and can be told to fail.
type recorder struct {
	mu        sync.Mutex
	prepared  map[string]int
	undone    map[string]int
	failOn    string
	failUndo  bool
	delegated prepare.Preparer
}

func (r *recorder) Prepare(ctx context.Context, a prepare.Allocation, dev slices.Entry) (prepare.Prepared, error) {
	r.mu.Lock()
	r.prepared[a.ShareKey()]++
	r.mu.Unlock()
	if r.failOn == a.Device {
		return prepare.Prepared{}, os.ErrPermission
	}
	return r.delegated.Prepare(ctx, a, dev)
}

func (r *recorder) Unprepare(ctx context.Context, a prepare.Allocation, undo json.RawMessage) error {
	r.mu.Lock()
	r.undone[a.ShareKey()]++
	failUndo := r.failUndo
	r.mu.Unlock()
	if failUndo {
		return os.ErrDeadlineExceeded
	}
	return r.delegated.Unprepare(ctx, a, undo)
}

func newEnv(t *testing.T, nic *recorder) *env {
	t.Helper()
	tree := sysfstest.Typical(t.TempDir())
	// The Xilinx card's device node, as udev would have made it.
	tree.Write("dev/xclmgmt15104", "")
	cfg, _ := nodeconfig.Decode([]byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nnetdev:\n  bandwidth:\n  - interface: eth0\n    egress: 1G\n"))
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: tree.Root})
	if err != nil {
		t.Fatal(err)
	}
	res := slices.Build(inv, cfg, "node-a")
	e := &env{t: t, root: tree.Root, state: t.TempDir(), cdiDir: t.TempDir(), devices: res.Index}
	e.cp, err = prepare.OpenCheckpoint(e.state, "boot-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	e.driver = e.newDriver(nic)
	return e
}

func (e *env) newDriver(nic *recorder) *prepare.Driver {
	cdiWriter, err := carvecdi.NewWriter(e.cdiDir, driverName)
	if err != nil {
		e.t.Fatal(err)
	}
	preparers := map[string]prepare.Preparer{
		names.KindFPGA: fpga.Preparer{Root: e.root},
		names.KindLLC:  llc.New(llc.Options{FS: sysfstest.ResctrlAt(e.root), HookPath: "/opt/carve/bin/carve"}),
		names.KindNIC:  fakeNIC{},
	}
	if nic != nil {
		nic.delegated = fakeNIC{}
		preparers[names.KindNIC] = nic
	}
	d, err := prepare.NewDriver(prepare.Options{DriverName: driverName, StateDir: e.state, Checkpoint: e.cp, CDI: cdiWriter,
		Preparers: preparers, Devices: func() map[string]slices.Entry { return e.devices }, ConflictWait: e.conflictWait})
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

// fakeNIC stands in for netdev's preparer, which needs network namespaces
// and is tested in its own package: here only the core's handling matters.
type fakeNIC struct{}

func (fakeNIC) Prepare(_ context.Context, a prepare.Allocation, dev slices.Entry) (prepare.Prepared, error) {
	cfg, err := prepare.DecodeEffectiveConfig(a.Config)
	if err != nil {
		return prepare.Prepared{}, err
	}
	env := []string{a.EnvPrefix() + "PARENT=" + dev.NIC.Name}
	if cfg.Network != nil && cfg.Network.InterfaceName != "" {
		env = append(env, a.EnvPrefix()+"INTERFACE="+cfg.Network.InterfaceName)
	}
	return prepare.Prepared{Edits: cdispec.ContainerEdits{Env: env}}, nil
}

func (fakeNIC) Unprepare(context.Context, prepare.Allocation, json.RawMessage) error { return nil }

type result struct {
	request, device string
	share           string
	consumed        map[resourceapi.QualifiedName]resource.Quantity
}

func claim(uid, name string, results []result, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, r := range results {
		ar := resourceapi.DeviceRequestAllocationResult{Request: r.request, Driver: driverName, Pool: "node-a", Device: r.device, ConsumedCapacity: r.consumed}
		if r.share != "" {
			ar.ShareID = ptr.To(types.UID(r.share))
		}
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, ar)
	}
	c.Status.Allocation.Devices.Config = configs
	return c
}

func opaque(source resourceapi.AllocationConfigSource, requests []string, doc string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{Source: source, Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(doc)}},
	}}
}

func bw(s string) map[resourceapi.QualifiedName]resource.Quantity {
	return map[resourceapi.QualifiedName]resource.Quantity{"egressBandwidth": resource.MustParse(s)}
}

func (e *env) prepare(claims ...*resourceapi.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	e.t.Helper()
	res, err := e.driver.PrepareResourceClaims(context.Background(), claims)
	if err != nil {
		e.t.Fatalf("PrepareResourceClaims: %v", err)
	}
	if len(res) != len(claims) {
		e.t.Fatalf("%d results for %d claims", len(res), len(claims))
	}
	return res
}

func (e *env) unprepare(uids ...string) {
	e.t.Helper()
	var objs []kubeletplugin.NamespacedObject
	for _, u := range uids {
		objs = append(objs, kubeletplugin.NamespacedObject{UID: types.UID(u)})
	}
	res, err := e.driver.UnprepareResourceClaims(context.Background(), objs)
	if err != nil {
		e.t.Fatal(err)
	}
	for u, err := range res {
		if err != nil {
			e.t.Fatalf("unprepare %s: %v", u, err)
		}
	}
}

func (e *env) specFiles() []string {
	files, _ := filepath.Glob(filepath.Join(e.cdiDir, "*"))
	return files
}

func (e *env) records() map[types.UID]prepare.ClaimRecord {
	recs, err := e.cp.Read()
	if err != nil {
		e.t.Fatal(err)
	}
	return recs
}
