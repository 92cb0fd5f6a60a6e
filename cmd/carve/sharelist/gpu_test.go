package sharelist

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/memslice"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/gpu/police"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices/names"
)

type gpuProcs []gpu.Process

func (g gpuProcs) Processes(context.Context, string) ([]gpu.Process, error) { return g, nil }

// gpuNode is a host root (its boot id, /proc) and a state directory holding
// one prepared mps-policed share of 10 GiB whose pod's process 4242 the
// agent has seen.
func gpuNode(t *testing.T) (root, state string) {
	t.Helper()
	root, state = t.TempDir(), t.TempDir()
	for path, data := range map[string]string{
		"proc/sys/kernel/random/boot_id": "boot-1\n",
		"proc/4242/cgroup":               "0::/kubepods/podaaaaaaaa-0000-0000-0000-000000000001/c\n",
	} {
		_ = os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755)
		if err := os.WriteFile(filepath.Join(root, path), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cp, err := prepare.OpenCheckpoint(state, "boot-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	sid := types.UID("share-1")
	a := prepare.Allocation{ClaimUID: "c1", ClaimNamespace: "ns", ClaimName: "train", Request: "gpu", Device: "gpu-0000-19-00-0", Kind: names.KindGPU, ShareID: &sid}
	rec, _ := json.Marshal(memslice.Record{Tier: memslice.TierMPSPoliced, UUID: "GPU-1", Slice: 10 << 30})
	if err := cp.Update(func(c *prepare.Records) error {
		c.Set("c1", prepare.ClaimRecord{UID: "c1", Namespace: "ns", Name: "train", State: prepare.ClaimCompleted,
			Allocations: []prepare.Allocation{a}, Undo: []json.RawMessage{rec}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	usage, _ := json.Marshal(police.Usage{a.ShareKey(): {UsedBytes: 1 << 30, Processes: 1, Kills: 2, Pods: []types.UID{"aaaaaaaa-0000-0000-0000-000000000001"}}})
	_ = os.MkdirAll(filepath.Join(state, memslice.SharesDir), 0o755)
	if err := os.WriteFile(filepath.Join(state, memslice.UsageFile), usage, 0o644); err != nil {
		t.Fatal(err)
	}
	return root, state
}

// A GPU share is listed beside NIC shares with the network contract's keys
// and its own under "gpu". Its daemon gone, it is not enforced; without
// NVML its use is the agent's last reading, never a number made up.
func TestGPUSharesListed(t *testing.T) {
	root, state := gpuNode(t)
	noNVML := func(context.Context) (police.Processes, func(), error) {
		return nil, nil, errors.New("libnvidia-ml.so.1 not found")
	}
	rows, err := List(context.Background(), &GPUSource{StateDir: state, Root: root, NVML: noNVML})
	if err != nil || len(rows) != 1 {
		t.Fatalf("List = %+v, %v", rows, err)
	}
	var buf bytes.Buffer
	if err := Write(&buf, rows, "json"); err != nil {
		t.Fatal(err)
	}
	var objs []map[string]any
	if err := json.Unmarshal(buf.Bytes(), &objs); err != nil {
		t.Fatal(err)
	}
	o := objs[0]
	for _, k := range []string{"claim", "shareID", "parent", "interface", "egressBandwidth", "ingressBandwidth", "egressRate", "ingressRate", "drops", "enforced"} {
		if _, ok := o[k]; !ok {
			t.Errorf("GPU row lacks %q: %v", k, o)
		}
	}
	g, _ := o["gpu"].(map[string]any)
	if o["kind"] != "gpu" || o["claim"] != "ns/train" || o["shareID"] != "share-1" || o["parent"] != "GPU-1" || o["enforced"] != false ||
		g["uuid"] != "GPU-1" || g["tier"] != "mps-policed" || g["sliceBytes"] != float64(10<<30) || g["kills"] != float64(2) ||
		g["usedBytes"] != float64(1<<30) || g["usedFrom"] != "agent" {
		t.Errorf("row %v", o)
	}
	if NotEnforced(rows) != 1 || !strings.Contains(strings.Join(rows[0].Problems, ";"), "MPS control daemon of GPU-1 is not running (claim ns/train's own") {
		t.Errorf("problems %v", rows[0].Problems)
	}
	buf.Reset()
	if err := Write(&buf, rows, "table"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"TIER", "SLICE", "USED", "KILLS", "ns/train", "mps-policed", "10Gi", "1Gi (agent)", "no: the MPS control daemon"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
	if strings.Contains(buf.String(), "EGRESS") {
		t.Errorf("a table of GPU shares only has the NIC header:\n%s", buf.String())
	}

	// No record from the agent either: used is unknown, and says why.
	_ = os.Remove(filepath.Join(state, memslice.UsageFile))
	rows, err = List(context.Background(), &GPUSource{StateDir: state, Root: root, NVML: noNVML})
	if err != nil || rows[0].GPU.UsedBytes != nil || !strings.Contains(rows[0].GPU.UsedUnknown, "libnvidia-ml.so.1 not found") {
		t.Fatalf("nothing measured: %+v, %v", rows, err)
	}
	buf.Reset()
	_ = Write(&buf, rows, "json")
	if !strings.Contains(buf.String(), `"usedBytes": null`) {
		t.Errorf("unknown use is not null:\n%s", buf.String())
	}
}

// With NVML and the daemon running, the share is enforced and its use is
// measured now, from its pod's processes.
func TestGPUShareEnforcedAndMeasured(t *testing.T) {
	root, state := gpuNode(t)
	d := mps.Daemon{Dir: memslice.DaemonDir(filepath.Join(state, memslice.SharesDir), "c1", "GPU-1"), UUID: "GPU-1"}
	pid := strconv.Itoa(os.Getpid())
	_ = os.MkdirAll(d.PipeDir(), 0o755)
	_ = os.WriteFile(filepath.Join(d.PipeDir(), "nvidia-cuda-mps-control.pid"), []byte(pid), 0o644)
	_ = os.MkdirAll(filepath.Join(root, "proc", pid), 0o755)
	_ = os.WriteFile(filepath.Join(root, "proc", pid, "environ"), []byte("CUDA_MPS_PIPE_DIRECTORY="+d.PipeDir()+"\x00"), 0o644)
	closed := false
	nv := func(context.Context) (police.Processes, func(), error) {
		return gpuProcs{{PID: 4242, UsedBytes: 3 << 30}, {PID: 7, UsedBytes: 1 << 30}}, func() { closed = true }, nil
	}
	rows, err := List(context.Background(), &GPUSource{StateDir: state, Root: root, NVML: nv})
	if err != nil || len(rows) != 1 {
		t.Fatalf("List = %+v, %v", rows, err)
	}
	g := rows[0].GPU
	if !rows[0].Enforced || g.UsedBytes == nil || *g.UsedBytes != 3<<30 || g.UsedFrom != "nvml" || g.Processes != 1 || !closed {
		t.Errorf("row %+v, gpu %+v, NVML closed %v", rows[0], g, closed)
	}
	if g.MPSDaemon == nil || !g.MPSDaemon.Running || g.MPSDaemon.PipeDir != d.PipeDir() {
		t.Errorf("the claim's daemon: %+v", g.MPSDaemon)
	}
	// A NIC row has no "gpu" key: the network contract is unchanged.
	b, _ := json.Marshal(Row{Claim: "ns/net", Kind: "nic"})
	if strings.Contains(string(b), `"gpu"`) {
		t.Errorf("NIC row %s", b)
	}
}
