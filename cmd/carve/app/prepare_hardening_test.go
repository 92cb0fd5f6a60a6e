package app_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/prepare"
	carvecdi "github.com/carve-dra/carve/prepare/cdi"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

// The state directory can be passed through but not listed, whatever mode
// it had (a hostPath volume creates it 0755, earlier agents made it 0700):
// a non-root pod's MPS server reaches its pipe directory below it by path.
// The claim files' directory is the agent's alone, whatever mode an earlier
// agent gave it.
func TestStateDirIsPrivate(t *testing.T) {
	e := newEnv(t, nil)
	if err := os.Chmod(e.state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(e.state, "claims"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(e.state, "claims"), 0o755); err != nil {
		t.Fatal(err)
	}
	e.newDriver(nil)
	for dir, want := range map[string]os.FileMode{e.state: 0o711, filepath.Join(e.state, "claims"): 0o700} {
		st, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", dir, st.Mode().Perm(), want)
		}
	}
}

// cleaner is a NIC preparer that also keeps its own records, as netdev does.
type cleaner struct {
	fakeNIC
	asked []types.UID
}

func (c *cleaner) UnprepareClaim(_ context.Context, uid types.UID) error {
	c.asked = append(c.asked, uid)
	return nil
}

// Unprepare of a claim the checkpoint does not know (its record was lost)
// has the preparers that keep their own records clean it up, and removes a
// CDI spec and claim file left of it; it is not answered "done" untouched.
func TestUnknownClaimIsCleanedFromPreparerState(t *testing.T) {
	e := newEnv(t, nil)
	c := &cleaner{}
	cdiWriter, err := carvecdi.NewWriter(e.cdiDir, driverName)
	if err != nil {
		t.Fatal(err)
	}
	d, err := prepare.NewDriver(prepare.Options{DriverName: driverName, StateDir: e.state, Checkpoint: e.cp, CDI: cdiWriter,
		Preparers: map[string]prepare.Preparer{names.KindNIC: c}, Devices: func() map[string]slices.Entry { return e.devices }})
	if err != nil {
		t.Fatal(err)
	}
	e.driver = d
	if err := cdiWriter.Write("lost-uid", []cdispec.Device{{Name: "x", ContainerEdits: cdispec.ContainerEdits{Env: []string{"A=b"}}}}); err != nil {
		t.Fatal(err)
	}
	info := filepath.Join(e.state, "claims", "lost-uid.json")
	if err := os.WriteFile(info, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.unprepare("lost-uid")
	if len(c.asked) != 1 || c.asked[0] != "lost-uid" {
		t.Errorf("preparer asked to clean %v, want [lost-uid]", c.asked)
	}
	if len(e.specFiles()) != 0 {
		t.Errorf("CDI specs left: %v", e.specFiles())
	}
	if _, err := os.Stat(info); !os.IsNotExist(err) {
		t.Errorf("claim file left (%v)", err)
	}
}

// Claim files of an earlier boot (their records were dropped with it) are
// removed when the driver starts; a file written in this boot is not.
func TestClaimFilesOfAnEarlierBootAreRemoved(t *testing.T) {
	e := newEnv(t, nil)
	old := filepath.Join(e.state, "claims", "old-boot.json")
	recent := filepath.Join(e.state, "claims", "this-boot.json")
	if err := os.WriteFile(old, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(recent, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	long := time.Unix(1, 0)
	if err := os.Chtimes(old, long, long); err != nil {
		t.Fatal(err)
	}
	e.newDriver(nil)
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("the earlier boot's claim file is still there (%v)", err)
	}
	if _, err := os.Stat(recent); err != nil {
		t.Errorf("this boot's claim file was removed: %v", err)
	}
}

// configRecorder is a NIC preparer that keeps the configs it is given.
type configRecorder struct {
	fakeNIC
	configs []prepare.EffectiveConfig
}

func (r *configRecorder) Prepare(ctx context.Context, a prepare.Allocation, dev slices.Entry) (prepare.Prepared, error) {
	cfg, err := prepare.DecodeEffectiveConfig(a.Config)
	if err != nil {
		return prepare.Prepared{}, err
	}
	r.configs = append(r.configs, cfg)
	return r.fakeNIC.Prepare(ctx, a, dev)
}

// A claim's NetworkConfig overrides only the fields a claim may set; the
// class's VLAN, routes and mode stay.
func TestClaimNetworkConfigOverlaysTheClass(t *testing.T) {
	e := newEnv(t, nil)
	rec := &configRecorder{}
	cdiWriter, _ := carvecdi.NewWriter(e.cdiDir, driverName)
	d, err := prepare.NewDriver(prepare.Options{DriverName: driverName, StateDir: e.state, Checkpoint: e.cp, CDI: cdiWriter,
		Preparers: map[string]prepare.Preparer{names.KindNIC: rec}, Devices: func() map[string]slices.Entry { return e.devices }})
	if err != nil {
		t.Fatal(err)
	}
	e.driver = d
	res := e.prepare(claim("overlay", "overlay", []result{{request: "net", device: "nic-0000-17-00-0"}},
		opaque(resourceapi.AllocationConfigSourceClass, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","vlan":42,"macvlanMode":"vepa","interfaceName":"adm0","routes":[{"destination":"10.9.0.0/16","gateway":"10.1.0.1"}],"allowedPools":["q","p"]}`),
		opaque(resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"carve.dev/v1alpha1","kind":"NetworkConfig","interfaceName":"data0","pools":["p"]}`)))
	if err := res["overlay"].Err; err != nil {
		t.Fatal(err)
	}
	if len(rec.configs) != 1 || rec.configs[0].Network == nil {
		t.Fatalf("configs = %+v", rec.configs)
	}
	n := rec.configs[0].Network
	if n.VLAN != 42 || n.MacvlanMode != "vepa" || len(n.Routes) != 1 || n.InterfaceName != "data0" || len(n.Pools) != 1 || n.Pools[0] != "p" {
		t.Errorf("effective config %+v: want the class's vlan, mode and routes with the claim's name and pools", n)
	}
}
