package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"

	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/deploy/e2e/kubeletstub"
	"github.com/carve-dra/carve/discovery/sysfstest"
)

// The agent, run as a host process against a fixture root, publishes its
// slices, registers, prepares and unprepares claims over its real unix
// socket, and reports metrics and health.
func TestAgentPrepareOverSocket(t *testing.T) {
	cs := client(t)
	ctx := context.Background()
	h := newAgentHost(t, cs, "e2e-agent")
	h.start()
	waitSlices(t, cs, h)
	plugin := h.register(ctx)
	defer plugin.Close()

	c1 := makeClaim(t, cs, h.node, "agent-c1", alloc{request: "fpga", device: "fpga-0000-3b-00-0"},
		alloc{request: "net", device: "nic-0000-17-00-0", share: true, egress: "100M"})
	c2 := makeClaim(t, cs, h.node, "agent-c2", alloc{request: "net", device: "nic-0000-17-00-0", share: true, egress: "200M"})
	res, err := plugin.Prepare(ctx, c1, c2)
	if err != nil {
		t.Fatalf("prepare: %v\n%s", err, h.logs)
	}
	shares := map[string]bool{}
	for _, c := range []kubeletstub.Claim{c1, c2} {
		r := res[c.UID]
		for _, d := range r.Devices {
			if len(d.CdiDeviceIds) != 1 || !strings.HasPrefix(d.CdiDeviceIds[0], "carve.dev/claim=") {
				t.Errorf("claim %s device %s CDI ids %v", c.Name, d.DeviceName, d.CdiDeviceIds)
			}
			if d.ShareId != nil {
				shares[*d.ShareId] = true
			}
		}
	}
	if len(shares) != 2 {
		t.Errorf("share ids %v, want two distinct ones for the two NIC shares", shares)
	}
	if specs := h.files("cdi"); len(specs) != 2 {
		t.Errorf("CDI specs %v, want one per claim", specs)
	}
	m := h.scrape()
	for _, want := range []string{"carve_prepared_claims 2", `carve_prepare_duration_seconds_count{kind="nic",result="success"} 2`,
		`carve_prepare_duration_seconds_count{kind="fpga",result="success"} 1`, "grpc_server_handled_total", "carve_discovery_duration_seconds_count"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if got := healthOf(t, h, ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health = %v; want SERVING", got)
	}
	if got := healthOf(t, h, "registration"); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health of the readiness service = %v; want SERVING once registered", got)
	}

	if err := plugin.Unprepare(ctx, c1, c2); err != nil {
		t.Fatal(err)
	}
	if specs := h.files("cdi"); len(specs) != 0 {
		t.Errorf("CDI specs left: %v", specs)
	}
	if !strings.Contains(h.scrape(), "carve_prepared_claims 0") {
		t.Errorf("prepared claims gauge not back to 0")
	}
	if err := h.stop(); err != nil {
		t.Errorf("SIGTERM: %v\n%s", err, h.logs)
	}
}

// nodeState is what a claim leaves on the node.
type nodeState struct {
	Records []string // "<uid>:<state>"
	Specs   []string
	Infos   []string
	// Links are carve's interfaces in the node's namespace (a parent's IFB
	// and egress shaper pair; a share's where an older agent made it), Classes the HTB classes on
	// the parent and those links.
	Links   []string
	Classes []string
	// Shares are the classifier's pinned entries.
	Shares []string
}

func (h *agentHost) state(t *testing.T) nodeState {
	t.Helper()
	var s nodeState
	raw, err := os.ReadFile(h.path("state/checkpoint.json"))
	if err == nil {
		var f struct {
			Data struct {
				Claims map[string]struct {
					State string `json:"state"`
				} `json:"claims"`
			} `json:"data"`
		}
		if err := json.Unmarshal(raw, &f); err != nil {
			t.Fatalf("checkpoint: %v", err)
		}
		for uid, c := range f.Data.Claims {
			s.Records = append(s.Records, uid+":"+c.State)
		}
	}
	sort.Strings(s.Records)
	s.Specs = h.files("cdi")
	s.Infos = h.files("state/claims")
	ns := filepath.Base(h.netns)
	out, _ := exec.Command("ip", "-n", ns, "-o", "link", "show").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], "cv") {
			s.Links = append(s.Links, strings.TrimSuffix(strings.Split(f[1], "@")[0], ":"))
		}
	}
	for _, dev := range append([]string{"ens1f0np0"}, s.Links...) {
		out, _ := exec.Command("tc", "-n", ns, "class", "show", "dev", dev).Output()
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(l); len(f) > 2 {
				s.Classes = append(s.Classes, dev+":"+f[2])
			}
		}
	}
	if shaper, err := bpf.OpenShaper(h.pins); err == nil {
		shares, _ := shaper.Shares()
		for k, classid := range shares {
			s.Shares = append(s.Shares, fmt.Sprintf("%s/%s:%x", k.MAC, k.Dir, classid))
		}
		shaper.Close()
	}
	sort.Strings(s.Links)
	sort.Strings(s.Classes)
	sort.Strings(s.Shares)
	return s
}

// The crash matrix: the agent is killed with SIGKILL at every step of
// prepare and unprepare, restarted, and the kubelet stand-in retries. After
// each retry the node holds exactly what a crash-free run holds: nothing
// leaked, nothing prepared twice, and the same CDI devices returned.
func TestCrashMatrix(t *testing.T) {
	cs := client(t)
	ctx := context.Background()
	h := newAgentHost(t, cs, "e2e-crash")
	c := makeClaim(t, cs, h.node, "crash-c", alloc{request: "fpga", device: "fpga-0000-3b-00-0"},
		alloc{request: "net", device: "nic-0000-17-00-0", share: true, egress: "100M"})

	// The crash-free run gives the reference.
	h.start()
	waitSlices(t, cs, h)
	p := h.register(ctx)
	ref, err := p.Prepare(ctx, c)
	if err != nil {
		t.Fatalf("%v\n%s", err, h.logs)
	}
	prepared := h.state(t)
	if len(prepared.Records) != 1 || !strings.HasSuffix(prepared.Records[0], ":completed") || len(prepared.Specs) != 1 || len(prepared.Infos) != 1 {
		t.Fatalf("prepared state = %+v", prepared)
	}
	if err := p.Unprepare(ctx, c); err != nil {
		t.Fatal(err)
	}
	p.Close()
	h.waitReaped(t)
	clean := h.state(t)
	h.stop()

	retry := func(fault string, call func(*kubeletstub.Plugin) error) {
		t.Helper()
		h.start(CrashAt(fault))
		p := h.register(ctx)
		if err := call(p); err == nil {
			t.Fatalf("%s: the call succeeded though the agent was to die there", fault)
		}
		p.Close()
		h.waitKilled()
		h.start()
		p = h.register(ctx)
		defer p.Close()
		if err := call(p); err != nil {
			t.Fatalf("%s: retry after restart: %v\n%s", fault, err, h.logs)
		}
	}
	// The parent's egress shaper pair for its egress limit; the share's
	// interface is the hook's to make, in the pod, and no pod runs here.
	if len(prepared.Links) != 2 || len(prepared.Classes) < 1 || len(prepared.Shares) != 1 {
		t.Fatalf("prepared network state = %+v, want the parent's egress shaper and the share's class, and no interface of the share's on the node", prepared)
	}
	for _, fault := range []string{"prepare-started", "prepare-device-0", "nic-link-created", "nic-shaped", "prepare-device-1",
		"prepare-cdi-written", "prepare-completed"} {
		t.Run(fault, func(t *testing.T) {
			retry(fault, func(p *kubeletstub.Plugin) error {
				res, err := p.Prepare(ctx, c)
				if err == nil && !reflect.DeepEqual(res[c.UID].Devices, ref[c.UID].Devices) {
					t.Errorf("devices after retry %v, want %v", res[c.UID].Devices, ref[c.UID].Devices)
				}
				return err
			})
			if got := h.state(t); !reflect.DeepEqual(got, prepared) {
				t.Errorf("after crash at %s and retry: %+v, want %+v", fault, got, prepared)
			}
			// Back to clean for the next fault.
			p := h.register(ctx)
			if err := p.Unprepare(ctx, c); err != nil {
				t.Fatal(err)
			}
			p.Close()
			h.waitReaped(t)
			h.stop()
			if got := h.state(t); !reflect.DeepEqual(got, clean) {
				t.Errorf("after unprepare: %+v, want %+v", got, clean)
			}
		})
	}
	for _, fault := range []string{"unprepare-device-1", "unprepare-device-0", "unprepare-undone"} {
		t.Run(fault, func(t *testing.T) {
			h.start()
			p := h.register(ctx)
			if _, err := p.Prepare(ctx, c); err != nil {
				t.Fatal(err)
			}
			p.Close()
			h.stop()
			retry(fault, func(p *kubeletstub.Plugin) error { return p.Unprepare(ctx, c) })
			h.waitReaped(t)
			h.stop()
			if got := h.state(t); !reflect.DeepEqual(got, clean) {
				t.Errorf("after crash at %s and retry: %+v, want %+v", fault, got, clean)
			}
		})
	}

}

// CrashAt is the environment that makes the agent die at a fault point.
func CrashAt(point string) string { return "CARVE_CRASH_AT=" + point }

// The agent publishes again when the hardware changes, and not when nothing
// did: the slices keep their resourceVersion across idle rescans.
func TestAgentRepublishesOnlyOnChange(t *testing.T) {
	cs := client(t)
	ctx := context.Background()
	h := newAgentHost(t, cs, "e2e-republish")
	h.rescan = "200ms"
	h.start()
	waitSlices(t, cs, h)
	versions := func() map[string]string {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + h.node})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, s := range l.Items {
			out[s.Name] = s.ResourceVersion
		}
		return out
	}
	before := versions()
	time.Sleep(time.Second) // five idle rescans
	if after := versions(); !reflect.DeepEqual(before, after) {
		t.Errorf("slices rewritten with nothing changed: %v then %v", before, after)
	}
	if m := h.scrape(); !strings.Contains(m, "carve_publishes_total 1\n") {
		t.Errorf("published more than once with nothing changed:\n%s", grepLines(m, "carve_publishes_total"))
	}
	// A new FPGA appears.
	h.tree.AddPCI("0000:af:00.0", sysfstest.PCI{Vendor: sysfstest.VendorXilinx, Device: sysfstest.DeviceAlveoU250, Class: sysfstest.ClassProcAccel, NUMANode: 1})
	waitFor(t, "the new FPGA published", 10*time.Second, func() (bool, error) {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + h.node})
		if err != nil {
			return false, err
		}
		for _, s := range l.Items {
			for _, d := range s.Spec.Devices {
				if d.Name == "fpga-0000-af-00-0" {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if m := h.scrape(); !strings.Contains(m, "carve_publishes_total 2\n") {
		t.Errorf("want exactly one more publish after the change:\n%s", grepLines(m, "carve_publishes_total"))
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A rolling update: a new agent (another pod UID) starts beside the old one
// on the same directories; the kubelet turns to the newest registration,
// which answers for claims the old one prepared; the old one stops cleanly
// and the new one unprepares everything.
func TestAgentRollingUpdate(t *testing.T) {
	cs := client(t)
	ctx := context.Background()
	old := newAgentHost(t, cs, "e2e-rolling")
	c1 := makeClaim(t, cs, old.node, "rolling-c1", alloc{request: "net", device: "nic-0000-17-00-0", share: true, egress: "100M"})
	c2 := makeClaim(t, cs, old.node, "rolling-c2", alloc{request: "net", device: "nic-0000-17-00-0", share: true, egress: "100M"})
	old.start("POD_UID=" + string(uuid.NewUUID()))
	waitSlices(t, cs, old)
	p := old.register(ctx)
	first, err := p.Prepare(ctx, c1)
	p.Close()
	if err != nil {
		t.Fatalf("prepare with the old agent: %v\n%s", err, old.logs)
	}

	next := *old // same directories, namespace and pins
	next.start("POD_UID=" + string(uuid.NewUUID()))
	defer next.stop()
	waitFor(t, "two registration sockets", 10*time.Second, func() (bool, error) {
		socks, _ := filepath.Glob(old.path("plugins_registry/*-reg.sock"))
		return len(socks) == 2, fmt.Errorf("sockets %v", socks)
	})
	time.Sleep(10 * time.Millisecond) // the newer socket must be strictly newer
	p = next.register(ctx)
	defer p.Close()
	again, err := p.Prepare(ctx, c1, c2)
	if err != nil {
		t.Fatalf("prepare with the new agent: %v\n%s", err, next.logs)
	}
	if !reflect.DeepEqual(again[c1.UID].Devices, first[c1.UID].Devices) {
		t.Errorf("the new agent answered c1 with %v, the old one had %v", again[c1.UID].Devices, first[c1.UID].Devices)
	}
	if err := old.stop(); err != nil {
		t.Errorf("the old agent on SIGTERM: %v\n%s", err, old.logs)
	}
	if err := p.Unprepare(ctx, c1, c2); err != nil {
		t.Fatalf("unprepare with the new agent after the old one left: %v\n%s", err, next.logs)
	}
	next.waitReaped(t)
	if st := next.state(t); len(st.Records) != 0 || len(st.Specs) != 0 || len(st.Links) != 0 || len(st.Shares) != 0 {
		t.Errorf("left after the rolling update: %+v", st)
	}
}

// The agent reports NIC health to the kubelet: a NIC whose link is down is
// unhealthy, and a link going down is reported.
func TestAgentReportsNICHealth(t *testing.T) {
	cs := client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := newAgentHost(t, cs, "e2e-health")
	h.rescan = "200ms"
	h.start()
	waitSlices(t, cs, h)
	p := h.register(ctx)
	defer p.Close()
	reports, err := p.WatchHealth(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := <-reports
	if first["nic-0000-17-00-0"] != drahealth.HealthStatus_HEALTHY || first["nic-0000-17-00-1"] != drahealth.HealthStatus_UNHEALTHY {
		t.Fatalf("first report %v: want ens1f0np0 healthy and ens1f1np1 (link down) unhealthy", first)
	}
	// ens1f0np0 loses its link.
	dir := filepath.Join(h.tree.PCIDir("0000:17:00.0"), "net/ens1f0np0")
	h.tree.Write(filepath.Join(dir, "operstate"), "down")
	h.tree.Write(filepath.Join(dir, "carrier"), "0")
	for r := range reports {
		if r["nic-0000-17-00-0"] == drahealth.HealthStatus_UNHEALTHY {
			return
		}
	}
	t.Fatalf("no report of ens1f0np0 going down\n%s", h.logs)
}
