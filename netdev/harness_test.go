package netdev_test

import (
	"context"
	"encoding/json"
	"fmt"
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
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/netdev/addrbook"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
	"github.com/carve-dra/carve/prepare/hook"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

type bench struct {
	t      testing.TB
	tp     *nettest.Topology
	shaper *bpf.Shaper
	pinDir string
	p      *netdev.NICPreparer
	state  string
	dev    slices.Entry
	// book records the bench's cluster-wide pool addresses, in an
	// in-memory API server (client-go's fake) that outlives preparers.
	book *addrbook.Book
	kube *fake.Clientset
}

func newBench(t testing.TB) *bench {
	t.Helper()
	tp := nettest.New(t)
	nettest.NeedBPFFS(t, bpf.MountBPFFS(bpf.DefaultBPFFS))
	pinDir := filepath.Join(bpf.DefaultBPFFS, "carve-test-"+string(uuid.NewUUID())[:8])
	shaper, err := bpf.OpenShaper(pinDir)
	if err != nil {
		t.Fatalf("open shaper: %v", err)
	}
	t.Cleanup(func() {
		shaper.Close()
		os.RemoveAll(pinDir)
	})
	b := &bench{t: t, tp: tp, shaper: shaper, pinDir: pinDir, state: t.TempDir(),
		kube: fake.NewClientset(),
		dev:  slices.Entry{Kind: "nic", NIC: &discovery.NIC{Name: tp.Parent, MTU: 1500}, Device: linkCapacity("10G")}}
	b.book = addrbook.New(addrbook.Options{Client: b.kube, Namespace: "carve-system", Node: "bench-node"})
	b.p = b.newPreparer("test", tp.Subnet, tp.ServerIP)
	return b
}

// linkCapacity is a published NIC of rate bits/s each way, as the agent's
// slices give it: its shaper's and IFB's link classes get the rate. The
// bench's own parent (a veth) takes far more than the 10G it is given.
func linkCapacity(rate string) resourceapi.Device {
	q := resource.MustParse(rate)
	return resourceapi.Device{Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		"egressBandwidth": {Value: q}, "ingressBandwidth": {Value: q}}}
}

// newPreparer is a preparer on the bench's node, state and classifier, whose
// node config has one address pool (gateway "" for none).
func (b *bench) newPreparer(pool, cidr, gateway string) *netdev.NICPreparer {
	b.t.Helper()
	return b.preparer(pool, cidr, gateway, "boot-test")
}

// newPreparerAt is newPreparer in a given kernel boot.
func (b *bench) newPreparerAt(bootID string) *netdev.NICPreparer {
	b.t.Helper()
	return b.preparer("test", b.tp.Subnet, "", bootID)
}

// newPreparerWith is newPreparer with more netdev settings in its node
// config, such as "  maxSharesPerNIC: 2\n".
func (b *bench) newPreparerWith(netdevConfig string) *netdev.NICPreparer {
	b.t.Helper()
	return b.preparerConfig("test", b.tp.Subnet, b.tp.ServerIP, "boot-test", netdevConfig)
}

func (b *bench) preparer(pool, cidr, gateway, bootID string) *netdev.NICPreparer {
	b.t.Helper()
	return b.preparerConfig(pool, cidr, gateway, bootID, "")
}

func (b *bench) preparerConfig(pool, cidr, gateway, bootID, netdevConfig string) *netdev.NICPreparer {
	b.t.Helper()
	config := "apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nnetdev:\n  pools:\n  - name: " + pool + "\n    cidr: " + cidr + "\n"
	if gateway != "" {
		config += "    gateway: " + gateway + "\n"
	}
	config += netdevConfig
	return b.preparerFrom(config, bootID)
}

// preparerFrom is a preparer with the node config given as YAML.
func (b *bench) preparerFrom(config, bootID string) *netdev.NICPreparer {
	b.t.Helper()
	cfg, err := nodeconfig.Decode([]byte(config))
	if err != nil {
		b.t.Fatal(err)
	}
	p, err := netdev.NewNICPreparer(netdev.Options{HostNS: b.tp.Node, StateDir: b.state, HookPath: "/bin/true", Config: cfg, Shaper: b.shaper, PinDir: b.pinDir, BootID: bootID, Addresses: b.book})
	if err != nil {
		b.t.Fatal(err)
	}
	// Before the classifier and the namespaces go.
	b.t.Cleanup(p.WaitReaped)
	return p
}

type share struct {
	alloc prepare.Allocation
	spec  hook.AttachSpec
	pod   netns.NsHandle
	ip    string
	mac   string
	undo  json.RawMessage
}

// alloc is an allocation of a share of the parent.
func (b *bench) alloc(name, egress, ingress string) prepare.Allocation {
	raw, _ := json.Marshal(prepare.EffectiveConfig{Network: &v1alpha1.NetworkConfig{Pools: []string{"test"}}})
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
func (b *bench) add(name, egress, ingress string, cfg *v1alpha1.NetworkConfig) *share {
	b.t.Helper()
	a := b.alloc(name, egress, ingress)
	if cfg != nil {
		a.Config, _ = json.Marshal(prepare.EffectiveConfig{Network: cfg})
	}
	return b.addAlloc(name, a)
}

// addAlloc is add for an allocation of the caller's (a whole-device claim:
// no ShareID).
func (b *bench) addAlloc(name string, a prepare.Allocation) *share {
	b.t.Helper()
	prepared, err := b.p.Prepare(context.Background(), a, b.dev)
	if err != nil {
		b.t.Fatalf("prepare %s: %v", name, err)
	}
	spec := b.specOf(a)
	pod := b.tp.NewPod(name)
	// What the createRuntime hook does, twice: every container runs it.
	for i := 0; i < 2; i++ {
		if err := hook.AttachToPod(b.tp.Node, pod, spec); err != nil {
			b.t.Fatalf("attach %s (run %d): %v", name, i, err)
		}
		if err := hook.RecordPodNetns(b.tp.Node, pod, spec); err != nil {
			b.t.Fatalf("record %s's netns (run %d): %v", name, i, err)
		}
	}
	s := &share{alloc: a, spec: spec, pod: pod, mac: spec.MAC, undo: prepared.Undo}
	if len(spec.Addresses) > 0 {
		s.ip = strings.Split(spec.Addresses[0], "/")[0]
	}
	// The network data names the MAC the pod's interface has: the
	// share's own, or for ipvlan its parent's (the share's MAC then only
	// names its classifier entries).
	ph, err := netlink.NewHandleAt(pod)
	if err != nil {
		b.t.Fatal(err)
	}
	defer ph.Close()
	podLink, err := ph.LinkByName(spec.PodName)
	if err != nil {
		b.t.Fatalf("%s's interface in its pod: %v", name, err)
	}
	if prepared.Network == nil || prepared.Network.HardwareAddress != podLink.Attrs().HardwareAddr.String() {
		b.t.Errorf("network data %+v, want the MAC of the pod's %s, %s", prepared.Network, spec.PodName, podLink.Attrs().HardwareAddr)
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
	return b.measureAfter(proto, dir, shares, time.Second, d)
}

// measureAfter is measureProto with a warm-up of its own.
func (b *bench) measureAfter(proto string, dir bpf.Direction, shares []*share, warmup, d time.Duration) (goodput, l2 []float64) {
	b.t.Helper()
	if proto == "udp" {
		b.t.Fatal("measureProto: UDP is measured by measureUDP, with an offered rate")
	}
	res, l2 := b.measureTCP(dir, shares, warmup, d)
	for _, r := range res {
		goodput = append(goodput, r.Goodput())
	}
	return goodput, l2
}

// measureTCP runs one TCP flow per share in direction dir for d after
// warmup, and returns each flow's result (the senders' retransmissions
// among them) and the classifier's count of the share's frames over the
// same window (bits/s).
func (b *bench) measureTCP(dir bpf.Direction, shares []*share, warmup, d time.Duration) (res []nettest.Result, l2 []float64) {
	b.t.Helper()
	flows := b.flows(dir, shares)
	var marks []map[bpf.Key]bpf.Counters
	mark := b.marker(&marks)
	res, err := nettest.RunFlows(flows, warmup, d, mark)
	if err != nil {
		b.t.Fatal(err)
	}
	for i, s := range shares {
		k := bpf.Key{MAC: s.mac, Dir: dir}
		l2 = append(l2, float64(marks[1][k].Bytes-marks[0][k].Bytes)*8/res[i].Duration.Seconds())
	}
	return res, l2
}

// flows is one flow per share in direction dir, each to its own port.
func (b *bench) flows(dir bpf.Direction, shares []*share) []nettest.Flow {
	var flows []nettest.Flow
	for i, s := range shares {
		port := 5201 + i
		if dir == bpf.Egress {
			flows = append(flows, nettest.Flow{From: s.pod, To: b.tp.Server, ToAddr: fmt.Sprintf("%s:%d", b.tp.ServerIP, port)})
		} else {
			flows = append(flows, nettest.Flow{From: b.tp.Server, To: s.pod, ToAddr: fmt.Sprintf("%s:%d", s.ip, port)})
		}
	}
	return flows
}

// marker appends the classifier's counters to marks each time it is called
// (as a measured window opens and closes).
func (b *bench) marker(marks *[]map[bpf.Key]bpf.Counters) func() {
	return func() {
		st, err := b.shaper.Stats()
		if err != nil {
			b.t.Error(err)
		}
		*marks = append(*marks, st)
	}
}

// measureUDP offers each share offered[i] bits/s of UDP with iperf3 in
// direction dir, and returns what was offered and received (payload bits/s)
// and the classifier's count over the same window (frame bits/s).
func (b *bench) measureUDP(dir bpf.Direction, shares []*share, offered []float64, d time.Duration) (res []nettest.UDPResult, l2 []float64) {
	b.t.Helper()
	flows := b.flows(dir, shares)
	var marks []map[bpf.Key]bpf.Counters
	mark := b.marker(&marks)
	res, err := nettest.RunIperfUDP(flows, 1400, offered, time.Second, d, mark)
	if err != nil {
		b.t.Fatal(err)
	}
	for i, s := range shares {
		k := bpf.Key{MAC: s.mac, Dir: dir}
		l2 = append(l2, float64(marks[1][k].Bytes-marks[0][k].Bytes)*8/res[i].Duration.Seconds())
	}
	return res, l2
}

// specOf reads the attach spec of a prepared allocation.
func (b *bench) specOf(a prepare.Allocation) hook.AttachSpec {
	b.t.Helper()
	spec, err := hook.ReadAttachSpec(filepath.Join(b.state, "netdev", netdev.LinkName(a.ShareKey())+".json"))
	if err != nil {
		b.t.Fatal(err)
	}
	return spec
}

// prepareSpec prepares a with cfg (unprepared when the test ends) and
// returns its attach spec.
func (b *bench) prepareSpec(a prepare.Allocation, cfg *v1alpha1.NetworkConfig) hook.AttachSpec {
	b.t.Helper()
	a.Config, _ = json.Marshal(prepare.EffectiveConfig{Network: cfg})
	prepared, err := b.p.Prepare(context.Background(), a, b.dev)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = b.p.Unprepare(context.Background(), a, prepared.Undo) })
	return b.specOf(a)
}
