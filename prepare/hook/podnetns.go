package hook

import (
	"fmt"

	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf"
)

// PodShareSpec is what the hook needs to tie the pod's network namespace to
// its share for egress classification: a frame a pod sends is then its
// share's whatever source MAC it carries (a pod with CAP_NET_RAW can forge
// one, with CAP_NET_ADMIN change its interface's).
type PodShareSpec struct {
	// PinDir is where the agent pinned the classifier's maps.
	PinDir string `json:"pinDir"`
	// ParentIndex is the parent's ifindex in the node's namespace.
	ParentIndex int `json:"parentIndex"`
	// ClassID is the share's egress HTB class, 0 where it has none.
	ClassID uint32 `json:"classID,omitempty"`
	// VLAN, AllowMACChange and CheckIPv4/6 say what the pod's frames may
	// claim (see bpf.PodShare): its VLAN's tag only, MACs other than the
	// share's (the class's allowMACChange), and whether its source
	// addresses are checked against the share's.
	VLAN           int  `json:"vlan,omitempty"`
	AllowMACChange bool `json:"allowMACChange,omitempty"`
	CheckIPv4      bool `json:"checkIPv4,omitempty"`
	CheckIPv6      bool `json:"checkIPv6,omitempty"`
	// AllowRouterAdvertisements lets the pod send IPv6 router
	// advertisements and redirects (the class's).
	AllowRouterAdvertisements bool `json:"allowRouterAdvertisements,omitempty"`
	// IngressAQM says the share's ingress class has bulk children whose
	// AQM runs on the interface's ingress, in the pod: the hook attaches
	// the program the agent pinned (bpf.AttachDequeued).
	IngressAQM bool `json:"ingressAQM,omitempty"`
	// Guard says the agent pinned a pod guard for the share
	// (bpf.PinPodGuard): the hook attaches it to the interface's egress
	// in the pod (bpf.PodHook), and fails if it cannot.
	Guard bool `json:"guard,omitempty"`
}

// Checks is what the share's frames are checked against: a bpf.PodShare
// with the VLAN and the flags only.
func (ps *PodShareSpec) Checks() bpf.PodShare {
	return bpf.PodShare{VLAN: ps.VLAN, AllowMACChange: ps.AllowMACChange, CheckIPv4: ps.CheckIPv4, CheckIPv6: ps.CheckIPv6,
		AllowRouterAdvertisements: ps.AllowRouterAdvertisements}
}

// RecordPodNetns records, in the classifier's pinned map, that frames sent
// out of the parent by sockets of podNS are the share's. It is idempotent
// (every container of the pod runs the hook). It refuses the node's own
// namespace (all of the node's traffic would become the share's) and a pod
// that already holds another share of the same parent (their frames could
// not be told apart). unprepare removes the entry by the share's MAC, so
// nothing else need be kept.
func RecordPodNetns(hostNS, podNS netns.NsHandle, spec AttachSpec) error {
	ps := spec.PodShare
	if ps == nil {
		return nil
	}
	var host, pod uint64
	if err := InNetns(hostNS, func() (err error) { host, err = bpf.NetnsCookie(); return err }); err != nil {
		return fmt.Errorf("the node's netns cookie: %w", err)
	}
	if err := InNetns(podNS, func() (err error) { pod, err = bpf.NetnsCookie(); return err }); err != nil {
		return fmt.Errorf("the pod's netns cookie: %w", err)
	}
	if pod == host {
		return fmt.Errorf("share %s: the pod runs in the node's network namespace; its share cannot be told from the node's traffic", spec.HostName)
	}
	m, err := bpf.OpenNetnsMap(ps.PinDir)
	if err != nil {
		return err
	}
	defer m.Close()
	share := ps.Checks()
	share.NetnsCookie, share.Parent, share.MAC, share.ClassID = pod, ps.ParentIndex, spec.MAC, ps.ClassID
	if err := m.Set(share); err != nil {
		return fmt.Errorf("share %s of %s: %w", spec.HostName, spec.Parent, err)
	}
	return nil
}
