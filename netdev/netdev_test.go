package netdev_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/netdev/netdevtest"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

type bench struct {
	t      testing.TB
	tp     *netdevtest.Topology
	shaper *bpf.Shaper
	p      *netdev.Preparer
	state  string
	dev    slices.Entry
}

func newBench(t testing.TB) *bench {
	t.Helper()
	tp := netdevtest.New(t)
	if err := bpf.MountBPFFS(bpf.DefaultBPFFS); err != nil {
		t.Skipf("no bpffs: %v", err)
	}
	pinDir := filepath.Join(bpf.DefaultBPFFS, "carve-test-"+string(uuid.NewUUID())[:8])
	shaper, err := bpf.OpenShaper(pinDir)
	if err != nil {
		t.Fatalf("open shaper: %v", err)
	}
	t.Cleanup(func() {
		shaper.Close()
		os.RemoveAll(pinDir)
	})
	cfg, err := nodeconfig.Decode([]byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nnetdev:\n  pools:\n  - name: test\n    cidr: " + tp.Subnet + "\n    gateway: " + tp.ServerIP + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	p, err := netdev.NewPreparer(netdev.Options{HostNS: tp.Node, StateDir: state, HookPath: "/bin/true", Config: cfg, Shaper: shaper})
	if err != nil {
		t.Fatal(err)
	}
	return &bench{t: t, tp: tp, shaper: shaper, p: p, state: state,
		dev: slices.Entry{Kind: "nic", NIC: &discovery.NIC{Name: tp.Parent, MTU: 1500}}}
}

type share struct {
	alloc prepare.Allocation
	spec  netdev.AttachSpec
	pod   netns.NsHandle
	ip    string
	mac   string
}

// alloc is an allocation of a share of the parent.
func (b *bench) alloc(name, egress, ingress string) prepare.Allocation {
	raw, _ := json.Marshal(prepare.EffectiveConfig{Network: &prepare.NetworkConfig{Pools: []string{"test"}}})
	a := prepare.Allocation{ClaimUID: types.UID(uuid.NewUUID()), ClaimNamespace: "default", ClaimName: name, Request: "net",
		Device: "nic-" + b.tp.Parent, Kind: "nic", ShareID: ptr.To(types.UID(uuid.NewUUID())),
		Consumed: map[resourceapi.QualifiedName]resource.Quantity{}, Config: raw}
	if egress != "" {
		a.Consumed["egressBandwidth"] = resource.MustParse(egress)
	}
	if ingress != "" {
		a.Consumed["ingressBandwidth"] = resource.MustParse(ingress)
	}
	return a
}

// add prepares a share of egress/ingress bits/s ("" for none) and runs the
// hook's work for a new pod namespace.
func (b *bench) add(name, egress, ingress string, cfg *prepare.NetworkConfig) *share {
	b.t.Helper()
	a := b.alloc(name, egress, ingress)
	if cfg != nil {
		a.Config, _ = json.Marshal(prepare.EffectiveConfig{Network: cfg})
	}
	prepared, err := b.p.Prepare(context.Background(), a, b.dev)
	if err != nil {
		b.t.Fatalf("prepare %s: %v", name, err)
	}
	spec, err := netdev.ReadAttachSpec(filepath.Join(b.state, "netdev", netdev.LinkName(a.ShareKey())+".json"))
	if err != nil {
		b.t.Fatal(err)
	}
	pod := b.tp.NewPod(name)
	// What the createRuntime hook does, twice: every container runs it.
	for i := 0; i < 2; i++ {
		if err := netdev.AttachToPod(b.tp.Node, pod, spec); err != nil {
			b.t.Fatalf("attach %s (run %d): %v", name, i, err)
		}
	}
	s := &share{alloc: a, spec: spec, pod: pod, mac: spec.MAC}
	if len(spec.Addresses) > 0 {
		s.ip = strings.Split(spec.Addresses[0], "/")[0]
	}
	if prepared.Network == nil || prepared.Network.HardwareAddress != spec.MAC {
		b.t.Errorf("network data %+v", prepared.Network)
	}
	b.t.Cleanup(func() { _ = b.p.Unprepare(context.Background(), a, prepared.Undo) })
	return s
}

func rate(s string) float64 {
	q := resource.MustParse(s)
	return float64(q.Value())
}

// measure runs one TCP flow per share in a direction and returns the
// goodput and the L2 rate (from the classifier's byte counters) of each.
func (b *bench) measure(dir bpf.Direction, shares []*share, d time.Duration) (goodput, l2 []float64) {
	return b.measureProto("tcp", dir, shares, d)
}

func (b *bench) measureProto(proto string, dir bpf.Direction, shares []*share, d time.Duration) (goodput, l2 []float64) {
	b.t.Helper()
	var flows []netdevtest.Flow
	for i, s := range shares {
		port := 5201 + i
		if dir == bpf.Egress {
			flows = append(flows, netdevtest.Flow{From: s.pod, To: b.tp.Server, ToAddr: fmt.Sprintf("%s:%d", b.tp.ServerIP, port)})
		} else {
			flows = append(flows, netdevtest.Flow{From: b.tp.Server, To: s.pod, ToAddr: fmt.Sprintf("%s:%d", s.ip, port)})
		}
	}
	var marks []map[bpf.Key]bpf.Counters
	mark := func() {
		st, err := b.shaper.Stats()
		if err != nil {
			b.t.Error(err)
		}
		marks = append(marks, st)
	}
	var res []netdevtest.Result
	var err error
	if proto == "udp" {
		res, err = netdevtest.RunUDP(flows, 1400, 500*time.Millisecond, d, mark)
	} else {
		res, err = netdevtest.RunFlows(flows, time.Second, d, mark)
	}
	if err != nil {
		b.t.Fatal(err)
	}
	for i, s := range shares {
		k := bpf.Key{MAC: s.mac, Dir: dir}
		goodput = append(goodput, res[i].Goodput())
		l2 = append(l2, float64(marks[1][k].Bytes-marks[0][k].Bytes)*8/res[i].Duration.Seconds())
	}
	return goodput, l2
}

// Two shares of one parent at once, each held to its own rate in both
// directions: the L2 rate within ±10% of the allocation at 50M, 200M and 1G.
func TestSharesHoldTheirRates(t *testing.T) {
	b := newBench(t)
	for r, round := range [][2]string{{"50M", "200M"}, {"1G", "200M"}} {
		shares := []*share{b.add(fmt.Sprintf("a%d", r), round[0], round[0], nil), b.add(fmt.Sprintf("b%d", r), round[1], round[1], nil)}
		for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
			goodput, l2 := b.measure(dir, shares, 3*time.Second)
			for i, limit := range round {
				l2Ratio, gpRatio := l2[i]/rate(limit), goodput[i]/rate(limit)
				t.Logf("%s %s share of %s: L2 %.1f Mbit/s (ratio %.3f), goodput %.1f Mbit/s (ratio %.3f)",
					dir, []string{"first", "second"}[i], limit, l2[i]/1e6, l2Ratio, goodput[i]/1e6, gpRatio)
				if l2Ratio < 0.9 || l2Ratio > 1.1 {
					t.Errorf("%s share of %s: L2 ratio %.3f is outside ±10%%", dir, limit, l2Ratio)
				}
			}
		}
		for _, s := range shares {
			if err := b.p.Unprepare(context.Background(), s.alloc, nil); err != nil {
				t.Fatalf("unprepare: %v", err)
			}
		}
	}
}

// Unprepare removes the share's interface, classes, classifier entries and
// attach spec, and the parent's HTB and IFB once no share is left.
func TestUnprepareLeavesNothing(t *testing.T) {
	b := newBench(t)
	s := b.add("gone", "100M", "100M", nil)
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	if q, _ := node.QdiscList(parent); !hasKind(q, "htb") {
		t.Fatalf("no HTB on the parent while a share is prepared: %v", q)
	}
	// The pod goes first, taking its interface with it, as when the
	// kubelet unprepares after the sandbox is gone; then unprepare twice.
	pod, _ := netlink.NewHandleAt(s.pod)
	if _, err := pod.LinkByName("net1"); err != nil {
		t.Errorf("net1 not in the pod: %v", err)
	}
	pod.Close()
	for i := 0; i < 2; i++ {
		if err := b.p.Unprepare(context.Background(), s.alloc, nil); err != nil {
			t.Fatalf("unprepare %d: %v", i, err)
		}
	}
	shares, _ := b.shaper.Shares()
	if len(shares) != 0 {
		t.Errorf("classifier entries left: %v", shares)
	}
	if q, _ := node.QdiscList(parent); hasKind(q, "htb") {
		t.Errorf("HTB left on the parent: %v", q)
	}
	if _, err := node.LinkByName("cvifb" + fmt.Sprint(parent.Attrs().Index)); err == nil {
		t.Errorf("IFB left behind")
	}
	if _, err := os.Stat(filepath.Join(b.state, "netdev", s.spec.HostName+".json")); !os.IsNotExist(err) {
		t.Errorf("attach spec left behind")
	}
}

func hasKind(qs []netlink.Qdisc, kind string) bool {
	for _, q := range qs {
		if q.Type() == kind {
			return true
		}
	}
	return false
}

// A pool hands out distinct addresses, keeps the gateway out, says clearly
// when it is exhausted, and takes addresses back on unprepare.
func TestAddressPool(t *testing.T) {
	b := newBench(t)
	cfg, _ := nodeconfig.Decode([]byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nnetdev:\n  pools:\n  - name: tiny\n    cidr: 10.78.0.0/30\n"))
	p, err := netdev.NewPreparer(netdev.Options{HostNS: b.tp.Node, StateDir: b.state, HookPath: "/bin/true", Config: cfg, Shaper: b.shaper})
	if err != nil {
		t.Fatal(err)
	}
	b.p = p
	one := b.add("one", "", "", &prepare.NetworkConfig{Pools: []string{"tiny"}})
	two := b.add("two", "", "", &prepare.NetworkConfig{Pools: []string{"tiny"}})
	if one.ip == two.ip || one.ip == "" {
		t.Errorf("addresses %s and %s", one.ip, two.ip)
	}
	raw, _ := json.Marshal(prepare.EffectiveConfig{Network: &prepare.NetworkConfig{Pools: []string{"tiny"}}})
	third := prepare.Allocation{ClaimUID: "third", Request: "net", Device: "nic0", Kind: "nic", Config: raw}
	if _, err := p.Prepare(context.Background(), third, b.dev); err == nil || !strings.Contains(err.Error(), "exhausted") {
		t.Errorf("third share from a /30: %v, want the pool exhausted", err)
	}
	if err := p.Unprepare(context.Background(), one.alloc, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Prepare(context.Background(), third, b.dev); err != nil {
		t.Errorf("after one left: %v", err)
	}
	_ = p.Unprepare(context.Background(), third, nil)
	_ = net.IPv4len
}

// ipvlan shares where the kernel has ipvlan: the interface reaches the pod
// with its address; a bandwidth share of one is refused, since the
// classifier keys on MACs and ipvlan children share the parent's.
func TestIPVlanShare(t *testing.T) {
	b := newBench(t)
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	probe := &netlink.IPVlan{LinkAttrs: netlink.LinkAttrs{Name: "ipvprobe", ParentIndex: parent.Attrs().Index}, Mode: netlink.IPVLAN_MODE_L2}
	if err := node.LinkAdd(probe); err != nil {
		t.Skipf("this kernel has no ipvlan (%v); ipvlan shares cannot be tested here", err)
	}
	_ = node.LinkDel(probe)
	s := b.add("ipv", "", "", &prepare.NetworkConfig{Mode: "ipvlan", IPVlanMode: "l2", Pools: []string{"test"}})
	pod, _ := netlink.NewHandleAt(s.pod)
	defer pod.Close()
	if l, err := pod.LinkByName("net1"); err != nil || l.Type() != "ipvlan" {
		t.Errorf("net1 in the pod: %v %v", l, err)
	}
	raw, _ := json.Marshal(prepare.EffectiveConfig{Network: &prepare.NetworkConfig{Mode: "ipvlan"}})
	a := b.alloc("ipv-bw", "100M", "")
	a.Config = raw
	if _, err := b.p.Prepare(context.Background(), a, b.dev); err == nil || !strings.Contains(err.Error(), "ipvlan") {
		t.Errorf("bandwidth share of an ipvlan: %v, want refused", err)
	}
}

// Where the kernel has sch_fq, egress is paced by EDT on an fq root instead
// of HTB, and holds the share to its rate.
func TestEDTShare(t *testing.T) {
	b := newBench(t)
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	peer := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fqprobe"}, PeerName: "fqprobe1"}
	if err := node.LinkAdd(peer); err != nil {
		t.Fatal(err)
	}
	probe, _ := node.LinkByName("fqprobe")
	err := node.QdiscReplace(&netlink.Fq{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: probe.Attrs().Index, Parent: netlink.HANDLE_ROOT}})
	_ = node.LinkDel(probe)
	if err != nil {
		t.Skipf("sch_fq not available (%v): EDT pacing cannot be tested here; HTB is used instead", err)
	}
	s := b.add("edt", "200M", "", nil)
	parent, _ := node.LinkByName(b.tp.Parent)
	if q, _ := node.QdiscList(parent); !hasKind(q, "fq") || hasKind(q, "htb") {
		t.Fatalf("parent qdiscs %v: want fq, not HTB", q)
	}
	goodput, _ := b.measure(bpf.Egress, []*share{s}, 3*time.Second)
	if ratio := goodput[0] / rate("200M"); ratio < 0.85 || ratio > 1.05 {
		t.Errorf("EDT share of 200M: goodput ratio %.3f", ratio)
	}
}

// Shares of one parent unprepared at the same time (the kubelet does this
// for pods deleted together) still leave the parent clean.
func TestConcurrentUnprepareLeavesParentClean(t *testing.T) {
	b := newBench(t)
	var shares []*share
	var undos []json.RawMessage
	for i := 0; i < 16; i++ {
		a := b.alloc(fmt.Sprintf("c%d", i), "50M", "50M")
		prepared, err := b.p.Prepare(context.Background(), a, b.dev)
		if err != nil {
			t.Fatal(err)
		}
		shares = append(shares, &share{alloc: a})
		undos = append(undos, prepared.Undo)
	}
	done := make(chan error)
	for i, s := range shares {
		go func(s *share, u json.RawMessage) { done <- b.p.Unprepare(context.Background(), s.alloc, u) }(s, undos[i])
	}
	for range shares {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	if q, _ := node.QdiscList(parent); hasKind(q, "htb") {
		t.Errorf("HTB left on the parent: %v", q)
	}
	if _, err := node.LinkByName("cvifb" + fmt.Sprint(parent.Attrs().Index)); err == nil {
		t.Errorf("IFB left behind")
	}
}

// After an agent restart (a new preparer restored from the records), the
// shares it did not prepare are unprepared in full, the parent's HTB and IFB
// included.
func TestUnprepareAfterRestart(t *testing.T) {
	b := newBench(t)
	ctx := context.Background()
	var allocs []prepare.Allocation
	var undos []json.RawMessage
	for i, l := range []string{"100M", "300M"} {
		a := b.alloc(fmt.Sprintf("r%d", i), l, l)
		prepared, err := b.p.Prepare(ctx, a, b.dev)
		if err != nil {
			t.Fatal(err)
		}
		allocs, undos = append(allocs, a), append(undos, prepared.Undo)
	}
	cfg, _ := nodeconfig.Decode([]byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nnetdev:\n  pools:\n  - name: test\n    cidr: " + b.tp.Subnet + "\n"))
	restarted, err := netdev.NewPreparer(netdev.Options{HostNS: b.tp.Node, StateDir: b.state, HookPath: "/bin/true", Config: cfg, Shaper: b.shaper})
	if err != nil {
		t.Fatal(err)
	}
	restarted.Restore(allocs, undos)
	for i := range allocs {
		if err := restarted.Unprepare(ctx, allocs[i], undos[i]); err != nil {
			t.Fatal(err)
		}
	}
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	if q, _ := node.QdiscList(parent); hasKind(q, "htb") {
		t.Errorf("HTB left on the parent: %v", q)
	}
	if ifb, err := node.LinkByName("cvifb" + fmt.Sprint(parent.Attrs().Index)); err == nil {
		classes, _ := node.ClassList(ifb, 0)
		t.Errorf("IFB left behind, with classes %v", classes)
	}
}
