package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/deploy/e2e/kubeletstub"
	"github.com/carve-dra/carve/discovery/cbm"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/prepare/llc/resctrl"
)

// An FPGA claim (selecting the loaded function by its afuID) and two LLC
// share claims are allocated by the real scheduler for pods bound to a
// fixture node, and prepared over the agent's socket: the FPGA's CDI spec
// gives the DFL card's FME and port as host nodes, the LLC shares' specs
// set linux.intelRdt with disjoint masks of cache 0, which the fixture's
// resctrl groups hold. After an agent restart the masks are unchanged and a
// third share is placed beside them.
func TestAgentSchedulerAllocatedFPGAAndLLCShares(t *testing.T) {
	cs := client(t)
	ctx := context.Background()
	h := newAgentHost(t, cs, "e2e-llc")
	h.start()
	waitSlices(t, cs, h)
	plugin := h.register(ctx)
	defer plugin.Close()
	schedulable(t, cs, h.node)
	for _, kind := range []string{"fpga", "llc"} {
		deviceClass(t, cs, "e2e-"+kind, kind)
	}
	fpga := scheduledClaim(t, cs, h.node, "e2e-fpga-afu", "e2e-fpga",
		fmt.Sprintf(`device.attributes["carve.dev"].?afuID.orValue("") == %q`, sysfstest.TypicalAFUID), nil)
	shares := map[string]kubeletstub.Claim{}
	for name, ways := range map[string]int64{"e2e-llc-a": 4, "e2e-llc-b": 3} {
		shares[name] = scheduledClaim(t, cs, h.node, name, "e2e-llc", `device.attributes["carve.dev"].cacheId == 0`,
			map[resourceapi.QualifiedName]resource.Quantity{"ways": *resource.NewQuantity(ways, resource.DecimalSI)})
	}
	res, err := plugin.Prepare(ctx, fpga, shares["e2e-llc-a"], shares["e2e-llc-b"])
	if err != nil {
		t.Fatalf("prepare: %v\n%s", err, h.logs)
	}
	for uid, r := range res {
		if r.Error != "" {
			t.Fatalf("claim %s: %s\n%s", uid, r.Error, h.logs)
		}
	}

	spec := h.cdiSpec(t, fpga.UID)
	var nodes []string
	for _, n := range spec.Devices[0].ContainerEdits.DeviceNodes {
		nodes = append(nodes, n.Path+"="+n.HostPath)
	}
	if got, want := strings.Join(nodes, " "), "/dev/dfl-fme.0=/dev/dfl-fme.0 /dev/dfl-port.0=/dev/dfl-port.0"; got != want {
		t.Errorf("FPGA device nodes %s, want %s (the card whose afuID the claim selected, as the host names them)", got, want)
	}
	masks := map[string]uint64{}
	for name, c := range shares {
		group, m := h.llcShare(t, c.UID)
		masks[group] = m
		t.Logf("%s: group %s mask %x", name, group, m)
	}
	if len(masks) != 2 {
		t.Fatalf("groups %v, want one per share", masks)
	}
	var union uint64
	for g, m := range masks {
		if union&m != 0 {
			t.Errorf("mask %x of %s overlaps another share's", m, g)
		}
		union |= m
		if got := h.groupMask(t, g); got != m {
			t.Errorf("resctrl group %s holds %x, the CDI spec says %x", g, got, m)
		}
	}
	if def := h.groupMask(t, ""); def&union != 0 || def == 0 {
		t.Errorf("default group %x overlaps the shares' %x", def, union)
	}

	// Restart: the masks stay, and a third share goes beside them.
	if err := h.stop(); err != nil {
		t.Fatalf("stop: %v\n%s", err, h.logs)
	}
	plugin.Close()
	h.start()
	plugin = h.register(ctx)
	defer plugin.Close()
	third := scheduledClaim(t, cs, h.node, "e2e-llc-c", "e2e-llc", `device.attributes["carve.dev"].cacheId == 0`,
		map[resourceapi.QualifiedName]resource.Quantity{"ways": resource.MustParse("2")})
	if res, err := plugin.Prepare(ctx, shares["e2e-llc-a"], shares["e2e-llc-b"], third); err != nil {
		t.Fatalf("prepare after restart: %v\n%s", err, h.logs)
	} else {
		for uid, r := range res {
			if r.Error != "" {
				t.Fatalf("claim %s after restart: %s\n%s", uid, r.Error, h.logs)
			}
		}
	}
	for g, m := range masks {
		if got := h.groupMask(t, g); got != m {
			t.Errorf("after restart group %s holds %x, want %x", g, got, m)
		}
	}
	g3, m3 := h.llcShare(t, third.UID)
	if m3&union != 0 {
		t.Errorf("share after restart %s = %x overlaps the first two (%x)", g3, m3, union)
	}

	if err := plugin.Unprepare(ctx, fpga, shares["e2e-llc-a"], shares["e2e-llc-b"], third); err != nil {
		t.Fatal(err)
	}
	for g := range masks {
		if _, err := os.Stat(filepath.Join(h.root, sysfstest.ResctrlDir, g)); !os.IsNotExist(err) {
			t.Errorf("group %s left after unprepare", g)
		}
	}
	if def := h.groupMask(t, ""); def != 0xffff {
		t.Errorf("default group after unprepare %x, want all 16 ways back", def)
	}
}

// cdiSpec reads a claim's CDI spec.
func (h *agentHost) cdiSpec(t *testing.T, uid string) cdispec.Spec {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(h.path("cdi"), "*"+uid+"*"))
	if len(files) != 1 {
		t.Fatalf("CDI specs of claim %s: %v", uid, files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(b, &spec); err != nil || len(spec.Devices) != 1 {
		t.Fatalf("CDI spec %s: %v\n%s", files[0], err, b)
	}
	return spec
}

// llcShare is the resctrl group and cache 0 mask an LLC share's CDI spec
// sets, checking the hook that backs it.
func (h *agentHost) llcShare(t *testing.T, uid string) (string, uint64) {
	t.Helper()
	edits := h.cdiSpec(t, uid).Devices[0].ContainerEdits
	rdt := edits.IntelRdt
	if rdt == nil || !strings.HasPrefix(rdt.ClosID, "carve-") {
		t.Fatalf("claim %s: intelRdt %+v", uid, rdt)
	}
	m, ok := strings.CutPrefix(rdt.L3CacheSchema, "L3:0=")
	mask, err := strconv.ParseUint(m, 16, 64)
	if !ok || err != nil || !cbm.Contiguous(mask) {
		t.Fatalf("claim %s: l3CacheSchema %q, want one contiguous mask of cache 0", uid, rdt.L3CacheSchema)
	}
	// The agent ships the small static hook beside itself, and names it.
	if len(edits.Hooks) != 1 || edits.Hooks[0].HookName != "createRuntime" || filepath.Base(edits.Hooks[0].Path) != "carve-hook" ||
		strings.Join(edits.Hooks[0].Args, " ") != "carve-hook resctrl-attach --resctrl /sys/fs/resctrl --group "+rdt.ClosID {
		t.Errorf("claim %s: hook %s %v", uid, edits.Hooks[0].Path, edits.Hooks[0].Args)
	}
	return rdt.ClosID, mask
}

// groupMask is cache 0's mask in a resctrl group of the fixture ("" the
// default group).
func (h *agentHost) groupMask(t *testing.T, group string) uint64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.root, sysfstest.ResctrlDir, group, "schemata"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := resctrl.ParseSchemata(string(b))
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Mask(0)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// schedulable gives a node without a kubelet what the scheduler needs to
// bind pods to it: room for pods, and Ready.
func schedulable(t testing.TB, cs kubernetes.Interface, node string) {
	t.Helper()
	ctx := context.Background()
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	room := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("16"),
		corev1.ResourceMemory: resource.MustParse("64Gi")}
	n.Status.Capacity, n.Status.Allocatable = room, room
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "E2E",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func deviceClass(t testing.TB, cs kubernetes.Interface, name, kind string) {
	t.Helper()
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.driver == "carve.dev" && device.attributes["carve.dev"].kind == %q`, kind)}}}}}
	_ = cs.ResourceV1().DeviceClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	if _, err := cs.ResourceV1().DeviceClasses().Create(context.Background(), dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.ResourceV1().DeviceClasses().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// scheduledClaim creates a claim of one request and a pod using it, bound
// by the scheduler to the node (and tolerating the taints of a node without
// a kubelet), and waits for the scheduler's allocation.
func scheduledClaim(t testing.TB, cs kubernetes.Interface, node, name, class, selector string, capacity map[resourceapi.QualifiedName]resource.Quantity) kubeletstub.Claim {
	t.Helper()
	ctx := context.Background()
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: class,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: selector}}}}
	if capacity != nil {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: capacity}
	}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "dev", Exactly: req}}}}}
	created, err := cs.ResourceV1().ResourceClaims("default").Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.PodSpec{
		Containers:     []corev1.Container{{Name: "main", Image: "none", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "dev"}}}}},
		ResourceClaims: []corev1.PodResourceClaim{{Name: "dev", ResourceClaimName: ptr.To(name)}},
		Tolerations:    []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}},
	}}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = cs.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		_ = cs.ResourceV1().ResourceClaims("default").Delete(ctx, name, metav1.DeleteOptions{})
	})
	waitFor(t, "the scheduler's allocation of claim "+name, 30*time.Second, func() (bool, error) {
		got, err := cs.ResourceV1().ResourceClaims("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if got.Status.Allocation == nil {
			return false, fmt.Errorf("not allocated yet")
		}
		r := got.Status.Allocation.Devices.Results
		return len(r) == 1 && r[0].Pool == node, fmt.Errorf("allocated %+v", r)
	})
	return kubeletstub.Claim{Namespace: "default", Name: name, UID: string(created.UID)}
}
