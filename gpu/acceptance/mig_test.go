//go:build acceptance

package acceptance

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/prep"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

var (
	enableMIG = flag.Bool("enable-mig", false, "turn MIG on for the MIG rows and off after (never on a lent machine: its MIG mode must not change)")
	smiPath   = flag.String("nvidia-smi", "nvidia-smi", "nvidia-smi, to hold carve's discovery against")
)

// openGPU opens the host's NVML, below -driver-root, and reads its inventory.
func openGPU(ctx context.Context, t *testing.T) (*gpu.Session, *nvmlinfo.Inventory) {
	t.Helper()
	s, err := gpu.Open(ctx, gpu.RealLibrary(*driverRoot), 10*time.Second)
	if err != nil {
		t.Fatalf("NVML from %s: %v", *driverRoot, err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	inv, err := s.Inventory(ctx)
	if err != nil || len(inv.Devices) == 0 {
		t.Fatalf("no GPU: %v", err)
	}
	return s, inv
}

func smi(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(*smiPath, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", *smiPath, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func printRows(t *testing.T, title string, rows []Row) {
	fmt.Printf("\n%s\n", title)
	if !Table(os.Stdout, rows) {
		t.Error("a row did not pass; see the table")
	}
}

// TestDiscovery holds carve's GPU inventory against nvidia-smi's.
func TestDiscovery(t *testing.T) {
	if *dryRun {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, inv := openGPU(ctx, t)
	gpus, err := ParseSMIQuery(smi(t, SMIQueryArgs...))
	if err != nil {
		t.Fatal(err)
	}
	printRows(t, "Discovery against nvidia-smi", DiscoveryRows(gpus, inv))
}

// TestMIG runs the MIG rows on GPU 0: every placement nvidia-smi lists is
// published with its name; each prepares, shows CUDA exactly its instance
// and unprepares; every pair of placements is allowed by the counters
// exactly where the driver makes both.
func TestMIG(t *testing.T) {
	if *dryRun {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, inv := openGPU(ctx, t)
	dev0 := inv.Devices[0]
	if !dev0.MIGCapable {
		t.Skipf("GPU 0 (%s) is not MIG-capable", dev0.Name)
	}
	if !dev0.MIGEnabled {
		if !*enableMIG {
			t.Skip("MIG is off on GPU 0 and -enable-mig was not given (a lent machine's MIG mode must never change); the MIG rows need it on")
		}
		t.Log(smi(t, "-i", "0", "-mig", "1"))
		t.Cleanup(func() {
			out, err := exec.Command(*smiPath, "-i", "0", "-mig", "0").CombinedOutput()
			fmt.Printf("MIG mode restored to off: %s (err %v)\n", strings.TrimSpace(string(out)), err)
		})
		s.Close(ctx)
		s, inv = openGPU(ctx, t)
		dev0 = inv.Devices[0]
		if !dev0.MIGEnabled {
			t.Fatal("MIG is still off on GPU 0 after nvidia-smi -mig 1 (pending a GPU reset?)")
		}
	}
	if len(dev0.Instances) > 0 {
		t.Fatalf("GPU 0 holds GPU instances already (%v): the MIG rows need it empty", dev0.Instances)
	}
	state, err := os.MkdirTemp("/tmp", "cvm-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	res := slices.Build(&discovery.Inventory{NVML: inv}, nodeconfig.Default(), "acceptance")
	published := MIGDevices(res, dev0.UUID)

	var rows []Row
	pls, err := ParseLGIPP(smi(t, "mig", "-i", "0", "-lgipp"))
	if err != nil {
		t.Fatal(err)
	}
	profileNames, err := ParseLGIP(smi(t, "mig", "-i", "0", "-lgip"))
	if err != nil {
		t.Fatal(err)
	}
	rows = append(rows, PlacementRow(pls, profileNames[0], published))

	p := prep.New(prep.Options{NVML: s, Root: "/", DriverRoot: "/", StateDir: state, Logger: ktesting.NewLogger(t, ktesting.NewConfig())})
	p.Devices = func() map[string]slices.Entry { return res.Index }
	var order []string
	for name := range published {
		order = append(order, name)
	}
	sort.Strings(order)
	rows = append(rows, placementsRow(ctx, t, s, p, published, order))
	rows = append(rows, besideRow(ctx, t, s, p, published, order))
	rows = append(rows, PairsRow(pairs(ctx, t, s, res, published, order)))
	printRows(t, "MIG on GPU 0", rows)
}

// placementsRow prepares each MIG device, runs the CUDA client with the
// claim's device nodes only, and unprepares it: passed where CUDA saw one
// device, the instance made, with the profile's memory, every time, and
// nothing was left.
func placementsRow(ctx context.Context, t *testing.T, s *gpu.Session, p *prep.Preparer, published map[string]slices.Entry, order []string) Row {
	var failed []string
	var slowest time.Duration
	for i, name := range order {
		e := published[name]
		a := prepare.Allocation{ClaimUID: types.UID(fmt.Sprintf("acc-mig-%d", i)), ClaimNamespace: "acc", ClaimName: fmt.Sprintf("mig-%d", i), Request: "mig",
			Pool: "acceptance", Device: name, Kind: names.KindMIG}
		start := time.Now()
		out, err := p.Prepare(ctx, a, e)
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s: prepare: %v", name, err))
			continue
		}
		slowest = max(slowest, time.Since(start))
		if why := cudaSeesOnly(ctx, t, s, e, out, uint32(*tenant)); why != "" {
			failed = append(failed, name+": "+why)
		}
		if err := p.Unprepare(ctx, a, out.Undo); err != nil {
			failed = append(failed, fmt.Sprintf("%s: unprepare: %v", name, err))
		}
		if left := instances(ctx, s, e.GPU.Device.UUID); left != "" {
			failed = append(failed, fmt.Sprintf("%s: left after unprepare: %s", name, left))
		}
	}
	r := Row{Attack: "MIG: each placement prepared, CUDA sees exactly it, unprepared",
		Outcome: fmt.Sprintf("%d of %d; slowest prepare %s", len(order)-len(failed), len(order), slowest.Round(time.Millisecond)), Passed: len(failed) == 0 && len(order) > 0}
	if len(failed) > 0 {
		r.Outcome += ": " + strings.Join(failed, "; ")
	}
	return r
}

// cudaSeesOnly runs the ctypes client as uid (a tenant where not 0) with
// the claim's device nodes as its /dev, read-only, and says what is wrong
// with what CUDA saw, or "": it must see exactly the claim's MIG device,
// the one whose UUID the claim's CARVE_<REQUEST>_MIG_UUID names (else the
// GPU's only one), whatever other instances the GPU holds.
func cudaSeesOnly(ctx context.Context, t *testing.T, s *gpu.Session, e slices.Entry, out prepare.Prepared, uid uint32) string {
	want := migUUIDs(ctx, s, e.GPU.Device.UUID)
	for _, kv := range out.Edits.Env {
		if k, v, _ := strings.Cut(kv, "="); strings.HasSuffix(k, "_MIG_UUID") {
			want = []string{v}
		}
	}
	dir, script := t.TempDir(), *client
	if uid != 0 {
		dir, script = openTempDir(t, "cvi-", 0o777), readableCopy(t, *client)
	}
	file := filepath.Join(dir, "info.json")
	c := exec.Command(*python, script, "--report", file, "--info")
	if uid != 0 {
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	}
	c.Env = os.Environ()
	c.Stdout, c.Stderr = os.Stderr, os.Stderr
	if err := StartWithDevices(c, out.Edits.DeviceNodes); err != nil {
		return "client: " + err.Error()
	}
	if err := c.Wait(); err != nil {
		return "client: " + err.Error()
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return "client report: " + err.Error()
	}
	var info struct {
		Count   int `json:"count"`
		Devices []struct {
			UUID     string `json:"uuid"`
			TotalMem uint64 `json:"totalMem"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(raw, &info); err != nil {
		return fmt.Sprintf("client report %s: %v", raw, err)
	}
	if info.Count != 1 || len(want) != 1 {
		return fmt.Sprintf("CUDA sees %d devices %v as uid %d; the claim's MIG device: %v", info.Count, info.Devices, uid, want)
	}
	if !strings.HasSuffix(want[0], info.Devices[0].UUID) {
		return fmt.Sprintf("CUDA sees %s, the instance made is %s", info.Devices[0].UUID, want[0])
	}
	profile := e.GPU.MIG.Profile.MemorySizeMB << 20
	if got := info.Devices[0].TotalMem; got > profile || got < profile*9/10 {
		return fmt.Sprintf("CUDA's device has %d MiB, the profile %d MiB", got>>20, profile>>20)
	}
	return ""
}

// migUUIDs are the UUIDs of the MIG devices GPU uuid holds.
func migUUIDs(ctx context.Context, s *gpu.Session, uuid string) []string {
	var out []string
	_ = s.Do(ctx, "MIG devices", func(l gpu.Library) error {
		dev, ret := l.DeviceGetHandleByUUID(uuid)
		if ret != nvml.SUCCESS {
			return nil
		}
		n, ret := dev.GetMaxMigDeviceCount()
		if ret != nvml.SUCCESS {
			return nil
		}
		for i := 0; i < n; i++ {
			mig, ret := dev.GetMigDeviceHandleByIndex(i)
			if ret != nvml.SUCCESS {
				continue
			}
			if u, ret := mig.GetUUID(); ret == nvml.SUCCESS {
				out = append(out, u)
			}
		}
		return nil
	})
	return out
}

// instances lists GPU uuid's GPU instances, "" where there are none.
func instances(ctx context.Context, s *gpu.Session, uuid string) string {
	inv, err := s.Inventory(ctx)
	if err != nil {
		return "inventory: " + err.Error()
	}
	for _, d := range inv.Devices {
		if d.UUID == uuid && len(d.Instances) > 0 {
			return fmt.Sprint(d.Instances)
		}
	}
	return ""
}

// pairs asks the driver, for every pair of placements, whether it makes
// both GPU instances at once, and the counters whether they allow both.
func pairs(ctx context.Context, t *testing.T, s *gpu.Session, res slices.Result, published map[string]slices.Entry, order []string) []Pair {
	sets := CounterSets(res)
	var out []Pair
	for i := range order {
		for j := i + 1; j < len(order); j++ {
			a, b := published[order[i]], published[order[j]]
			pr := Pair{A: order[i], B: order[j]}
			pr.Counters, pr.CounterProblem = CountersAllow(sets, a.Device, b.Device)
			err := s.Do(ctx, "MIG pair", func(l gpu.Library) error {
				dev, ret := l.DeviceGetHandleByUUID(a.GPU.Device.UUID)
				if ret != nvml.SUCCESS {
					return fmt.Errorf("GPU %s: %s", a.GPU.Device.UUID, nvml.ErrorString(ret))
				}
				var made []nvml.GpuInstance
				defer func() {
					for _, gi := range made {
						if ret := gi.Destroy(); ret != nvml.SUCCESS {
							t.Errorf("destroy a pair's GPU instance: %s", nvml.ErrorString(ret))
						}
					}
				}()
				for k, e := range []slices.Entry{a, b} {
					info, ret := dev.GetGpuInstanceProfileInfo(e.GPU.MIG.Profile.ProfileIndex)
					if ret != nvml.SUCCESS {
						return fmt.Errorf("profile index %d: %s", e.GPU.MIG.Profile.ProfileIndex, nvml.ErrorString(ret))
					}
					pl := nvml.GpuInstancePlacement{Start: uint32(e.GPU.MIG.Placement.Start), Size: uint32(e.GPU.MIG.Placement.Size)}
					gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &pl)
					if ret != nvml.SUCCESS {
						if k == 0 {
							return fmt.Errorf("the first of the pair alone, %s: %s", order[i], nvml.ErrorString(ret))
						}
						pr.DriverRefusal = nvml.ErrorString(ret)
						return nil
					}
					made = append(made, gi)
				}
				pr.Driver = true
				return nil
			})
			if err != nil {
				pr.CounterProblem = err
			}
			out = append(out, pr)
		}
	}
	return out
}

// besideRow prepares two instances that share no slice, for two claims,
// and runs the client of each as the tenant uid with its own claim's nodes
// (a read-only /dev): each must see its own MIG device only, with the
// other's instance there beside it.
func besideRow(ctx context.Context, t *testing.T, s *gpu.Session, p *prep.Preparer, published map[string]slices.Entry, order []string) Row {
	r := Row{Attack: fmt.Sprintf("MIG: two tenants' instances side by side, each client as uid %d with a read-only /dev of its claim's nodes sees its own only", *tenant)}
	var a, b string
	for _, x := range order {
		for _, y := range order {
			px, py := published[x].GPU.MIG.Placement, published[y].GPU.MIG.Placement
			if a == "" && x < y && (px.Start+px.Size <= py.Start || py.Start+py.Size <= px.Start) {
				a, b = x, y
			}
		}
	}
	if a == "" {
		r.Outcome = "no two published placements share no slice"
		return r
	}
	var failed []string
	var made []prepare.Allocation
	var undo [][]byte
	outs := map[string]prepare.Prepared{}
	for i, name := range []string{a, b} {
		al := prepare.Allocation{ClaimUID: types.UID(fmt.Sprintf("acc-beside-%d", i)), ClaimNamespace: "acc", ClaimName: fmt.Sprintf("beside-%d", i), Request: "mig",
			Pool: "acceptance", Device: name, Kind: names.KindMIG}
		out, err := p.Prepare(ctx, al, published[name])
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s: prepare: %v", name, err))
			continue
		}
		made, undo, outs[name] = append(made, al), append(undo, out.Undo), out
	}
	for name, out := range outs {
		if why := cudaSeesOnly(ctx, t, s, published[name], out, uint32(*tenant)); why != "" {
			failed = append(failed, name+": "+why)
		}
	}
	for i, al := range made {
		if err := p.Unprepare(ctx, al, undo[i]); err != nil {
			failed = append(failed, fmt.Sprintf("%s: unprepare: %v", al.Device, err))
		}
	}
	if left := instances(ctx, s, published[a].GPU.Device.UUID); left != "" {
		failed = append(failed, "left after unprepare: "+left)
	}
	r.Passed = len(failed) == 0 && len(outs) == 2
	r.Outcome = fmt.Sprintf("%s and %s", a, b)
	if len(failed) > 0 {
		r.Outcome += ": " + strings.Join(failed, "; ")
	}
	return r
}
