package sharelist

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/checkpoint"
	"github.com/carve-dra/carve/slices/names"
)

// NICSource lists NIC shares from the checkpoint in StateDir and checks
// them against the node: the classifier's entries and links pinned in
// PinDir and the HTB classes. Rates are measured over Interval.
type NICSource struct {
	StateDir string
	PinDir   string
	Interval time.Duration
	// Root is where the node's /proc is ("/"): its boot id selects the
	// checkpoint's records, its init process's network namespace is where
	// parents live.
	Root string
	// node is the kernel; nil opens the real one.
	node node
}

// Shares implements Source.
func (s *NICSource) Shares(ctx context.Context) ([]Row, error) {
	root := s.Root
	if root == "" {
		root = "/"
	}
	records, err := readRecords(root, s.StateDir)
	if err != nil {
		return nil, err
	}
	n := s.node
	if n == nil {
		kn, err := openNode(root, s.PinDir)
		if err != nil {
			return nil, err
		}
		defer kn.close()
		n = kn
	}
	state, err := readState(ctx, n, s.Interval)
	if err != nil {
		return nil, err
	}
	rows := []Row{}
	for _, rec := range records {
		for i, a := range rec.Allocations {
			if a.Kind != names.KindNIC {
				continue
			}
			r := Row{Claim: rec.Namespace + "/" + rec.Name, ClaimUID: string(rec.UID), Kind: a.Kind, Device: a.Device,
				EgressBandwidth: consumed(a, names.CapEgressBandwidth), IngressBandwidth: consumed(a, names.CapIngressBandwidth)}
			if a.ShareID != nil {
				r.ShareID = string(*a.ShareID)
			}
			r.Interface = interfaceOf(rec, a)
			if rec.State != prepare.ClaimCompleted || i >= len(rec.Undo) || len(rec.Undo[i]) == 0 {
				r.Problems = append(r.Problems, "preparation not completed")
			} else if u, err := netdev.DecodeShareRecord(rec.Undo[i]); err != nil {
				r.Problems = append(r.Problems, err.Error())
			} else {
				state.check(n, &r, u)
			}
			r.Enforced = len(r.Problems) == 0
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// CheckStateDir fails unless dir holds the agent's checkpoint, which the
// agent writes as it starts: a directory without one is not the agent's,
// and listing it as a node without shares would pass a node check by
// mistake.
func CheckStateDir(dir string) error {
	path := checkpoint.Path(dir)
	_, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no agent checkpoint at %s: %s is not the agent's state directory, or the agent never started on this node; "+
			"pass the agent's --state-dir (the chart sets CARVE_STATE_DIR in the agent's container)", path, dir)
	}
	if err != nil {
		return fmt.Errorf("the agent's checkpoint: %w", err)
	}
	return nil
}

// readRecords reads the checkpoint's records of this boot.
func readRecords(root, stateDir string) (map[string]prepare.ClaimRecord, error) {
	claims, err := prepare.ReadRecords(root, stateDir)
	if err != nil {
		return nil, err
	}
	out := make(map[string]prepare.ClaimRecord, len(claims))
	for uid, r := range claims {
		out[string(uid)] = r
	}
	return out, nil
}

func consumed(a prepare.Allocation, name resourceapi.QualifiedName) int64 {
	q, ok := a.Consumed[name]
	if !ok || q.Sign() <= 0 {
		return 0
	}
	return q.Value()
}

// interfaceOf is the share's interface name in its pod, as reported in the
// claim's status.
func interfaceOf(rec prepare.ClaimRecord, a prepare.Allocation) string {
	for _, d := range rec.Devices {
		if d.Request != a.Request || d.Device != a.Device || d.Network == nil {
			continue
		}
		if (d.ShareID == nil) != (a.ShareID == nil) || d.ShareID != nil && *d.ShareID != *a.ShareID {
			continue
		}
		return d.Network.InterfaceName
	}
	return ""
}

// state is what the node holds for every share, read once per listing.
type state struct {
	shares map[bpf.Key]uint32
	rates  map[string]uint64
	// addrs maps each share address (by parent and address, MAC empty)
	// to the MAC of the share it names.
	addrs    map[bpf.AddrShare]string
	links    []bpf.PinnedLink
	before   map[bpf.Key]bpf.Counters
	after    map[bpf.Key]bpf.Counters
	elapsed  time.Duration
	mapsErr  error
	ifindex  map[string]int
	classes  map[int]map[uint32]uint64
	queues   map[int]map[uint32]string
	aqm      map[bpf.Key]bpf.AQMCounters
	linkErrs map[string]error
	// egressShapers are the parents' egress shapers, by parent ifindex.
	egressShapers map[int]bpf.EgressShaperLinks
	// spoofed are the frames dropped for spoofing, by share MAC.
	spoofed map[string]bpf.SpoofDrops
}

// readState reads the classifier twice, interval apart, for the rates.
func readState(ctx context.Context, n node, interval time.Duration) (*state, error) {
	st := &state{ifindex: map[string]int{}, classes: map[int]map[uint32]uint64{}, queues: map[int]map[uint32]string{}, linkErrs: map[string]error{}}
	if st.mapsErr = n.mapsErr(); st.mapsErr != nil {
		return st, nil
	}
	var err error
	if st.shares, err = n.shares(); err != nil {
		return nil, err
	}
	if st.rates, err = n.rates(); err != nil {
		return nil, err
	}
	if st.spoofed, err = n.spoofDrops(); err != nil {
		return nil, err
	}
	if st.aqm, err = n.aqm(); err != nil {
		return nil, err
	}
	if st.links, err = n.links(); err != nil {
		return nil, err
	}
	addrs, err := n.shareAddrs()
	if err != nil {
		return nil, err
	}
	st.addrs = make(map[bpf.AddrShare]string, len(addrs))
	for _, a := range addrs {
		st.addrs[bpf.AddrShare{Parent: a.Parent, VLAN: a.VLAN, Addr: a.Addr}] = a.MAC
	}
	if st.egressShapers, err = n.egressShapers(); err != nil {
		return nil, err
	}
	start := time.Now()
	if st.before, err = n.stats(); err != nil {
		return nil, err
	}
	if interval > 0 {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(interval):
		}
	}
	if st.after, err = n.stats(); err != nil {
		return nil, err
	}
	st.elapsed = time.Since(start)
	return st, nil
}
