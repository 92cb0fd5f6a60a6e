package v1alpha1

import (
	"fmt"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DeviceConfig applies to a device of any kind.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type DeviceConfig struct {
	metav1.TypeMeta `json:",inline"`
	// Env is added to the environment of every container using the device.
	Env map[string]string `json:"env,omitempty"`
	// ClaimEnv, in a DeviceClass's config only, names the variables a
	// claim of the class may add to Env: only these, any of them. Unset, a
	// claim may add any variable but those that change what code a
	// container loads or runs (CodeHookEnv): the admin's, in the class.
	ClaimEnv []string `json:"claimEnv,omitempty"`
}

// NetworkConfig configures a NIC share: the interface the pod sees.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type NetworkConfig struct {
	metav1.TypeMeta `json:",inline"`
	// Mode is the kind of child interface: macvlan (default) or ipvlan.
	Mode string `json:"mode,omitempty"`
	// MacvlanMode is vepa (default), private or bridge. bridge is refused
	// for a share with a bandwidth limit: frames between children of one
	// parent would bypass its shaper. (passthru, which gives one pod the
	// whole NIC, is never used for a share.)
	MacvlanMode string `json:"macvlanMode,omitempty"`
	// IPVlanMode is l2 (default), l3 or l3s.
	IPVlanMode string `json:"ipvlanMode,omitempty"`
	// InterfaceName is the name of the share's interface inside the pod
	// (default net1).
	InterfaceName string `json:"interfaceName,omitempty"`
	// MTU of that interface; the parent's when zero.
	MTU int `json:"mtu,omitempty"`
	// VLAN, when set, puts the share on a VLAN of the parent.
	VLAN int `json:"vlan,omitempty"`
	// Addresses are static addresses in CIDR form, IPv4 or IPv6.
	Addresses []string `json:"addresses,omitempty"`
	// Pools name address pools of the node's config to take one address
	// from each; the address is released on unprepare. A claim may name
	// only pools its DeviceClass names, here or in AllowedPools.
	Pools []string `json:"pools,omitempty"`
	// AllowedPools are more pools of the node's config that the class's
	// claims may name in their pools (Pools are allowed too, and taken by
	// claims that name none). A class that names no pool in either leaves
	// its claims none: pools belong to classes, so that a tenant's class
	// keeps other tenants out of its subnets. Set in the DeviceClass only.
	AllowedPools []string `json:"allowedPools,omitempty"`
	// Routes are added in the pod through this interface.
	Routes []Route `json:"routes,omitempty"`
	// AllowMACChange lets the pod send from other MACs than its share's
	// (a pod with CAP_NET_ADMIN that changes its interface's); they are
	// learned for its ingress, a few per share. Off by default: a frame
	// from another MAC is dropped, as SR-IOV's spoofchk does. Set in the
	// DeviceClass only.
	AllowMACChange bool `json:"allowMACChange,omitempty"`
	// AllowNetAdmin lets a container with CAP_NET_ADMIN or CAP_SYS_ADMIN
	// (a privileged one has both) use the share. Without it such a
	// container does not start: it could change its interface's MAC and
	// addresses, or nest a link on it that lands on the node's NIC. Set
	// by the DeviceClass (the admin), never by a claim.
	AllowNetAdmin bool `json:"allowNetAdmin,omitempty"`
	// OpenFamilies lists the address families (IPv4, IPv6) in which a
	// share that carve gave no address of the family may send from any
	// address: one that gets its address on the segment (DHCP, SLAAC).
	// A family left closed is checked against the share's addresses
	// even where it has none: then no IPv4 or ARP but a DHCP client's
	// request and an ARP probe, and no IPv6 but from the interface's own
	// link-local address. A share's own addresses are checked whatever
	// this says. Set by the DeviceClass (the admin), never by a claim.
	OpenFamilies []string `json:"openFamilies,omitempty"`
	// Ethertypes lists more ethertypes the share's pod may send, besides
	// IPv4, ARP and IPv6 (every share's), as 0x-prefixed hex (0x88F7:
	// PTP), at most MaxEthertypes. Frames of these are checked for the
	// share's MAC and VLAN and never sent to an IEEE 802.1 link-local
	// group, but not looked into. Never an 802.1Q or 802.1ad tag (the
	// share's VLAN is its vlan). Set by the DeviceClass (the admin),
	// never by a claim.
	Ethertypes []string `json:"ethertypes,omitempty"`
	// AllowRouterAdvertisements lets the share's pod send IPv6 router
	// advertisements and redirects: a pod that routes for the segment.
	// Off by default: one would make itself every neighbour's router.
	// Their link-layer address options must still be the share's MAC.
	// Set by the DeviceClass (the admin), never by a claim.
	AllowRouterAdvertisements bool `json:"allowRouterAdvertisements,omitempty"`
	// EgressCeiling and IngressCeiling let a share borrow the link's idle
	// capacity up to them: its consumed egressBandwidth and
	// ingressBandwidth stay its floor, which it gets whatever the other
	// shares do. A quantity (bits per second, e.g. 1G) or "link" (the
	// NIC's published capacity). Only in a DeviceClass that sets
	// MaxCeiling; a claim may set them, within it. Unset there, a claim
	// of such a class gets MaxCeiling.
	EgressCeiling  string `json:"egressCeiling,omitempty"`
	IngressCeiling string `json:"ingressCeiling,omitempty"`
	// MaxCeiling, in a DeviceClass only, lets the class's claims borrow,
	// each direction up to it: a quantity or "link". Unset, the class's
	// shares are held to their floors (hard caps), as before.
	MaxCeiling string `json:"maxCeiling,omitempty"`
}

// CeilingLink is the ceiling that stands for the NIC's whole capacity.
const CeilingLink = "link"

// Address families OpenFamilies may name.
const (
	FamilyIPv4 = "IPv4"
	FamilyIPv6 = "IPv6"
)

// MaxEthertypes is how many Ethertypes a class may list.
const MaxEthertypes = 8

// ParseEthertype reads one of Ethertypes: 0x-prefixed hex, 0x0600 or more
// (below is an 802.3 length), not one every share may send already, and no
// VLAN tag.
func ParseEthertype(s string) (uint16, error) {
	if len(s) < 3 || (s[:2] != "0x" && s[:2] != "0X") {
		return 0, fmt.Errorf("%q: not 0x-prefixed hex, e.g. 0x88F7", s)
	}
	v, err := strconv.ParseUint(s[2:], 16, 16)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%q: not a 16-bit hex number, e.g. 0x88F7", s)
	case v < 0x0600:
		return 0, fmt.Errorf("%q: under 0x0600, an 802.3 length, not an ethertype", s)
	case v == 0x0800 || v == 0x0806 || v == 0x86dd:
		return 0, fmt.Errorf("%q: IPv4, ARP and IPv6 are every share's already, checked against its addresses", s)
	case v == 0x8100 || v == 0x88a8 || v == 0x9100 || v == 0x9200 || v == 0x9300:
		return 0, fmt.Errorf("%q: a VLAN tag; a share's VLAN is its vlan, tagged on the node", s)
	}
	return uint16(v), nil
}

// EthertypeValues is Ethertypes as numbers; the first that does not parse
// is the error.
func (n *NetworkConfig) EthertypeValues() ([]uint16, error) {
	var out []uint16
	for _, s := range n.Ethertypes {
		v, err := ParseEthertype(s)
		if err != nil {
			return nil, fmt.Errorf("ethertypes: %w", err)
		}
		out = append(out, v)
	}
	return out, nil
}

// Opens reports whether the config opens family (OpenFamilies).
func (n *NetworkConfig) Opens(family string) bool {
	return slices.Contains(n.OpenFamilies, family)
}

// GPUConfig configures a GPU memory share (a claim with capacity
// {memory: ...} of a gpu.carve.dev device).
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type GPUConfig struct {
	metav1.TypeMeta `json:",inline"`
	// SharedMemorySize bounds the tmpfs the claim's pods get as /dev/shm
	// (shared with the claim's MPS daemons), e.g. 4Gi; the agent's
	// --mps-shm-size (the chart's mpsShmSize, 1Gi) when unset. Its pages
	// are charged to the pods that write them: a cap, not a reservation.
	// One tmpfs serves the whole claim: where its requests ask for
	// different sizes, the largest holds. Between 1Mi and 1Ti, and no
	// more than maxSharedMemorySize.
	SharedMemorySize *resource.Quantity `json:"sharedMemorySize,omitempty"`
	// MaxSharedMemorySize is the most a claim may ask in
	// sharedMemorySize: set by the DeviceClass (the admin), never by the
	// claim. Where the class sets none, a claim may ask no more than the
	// agent's --mps-shm-size: pages nobody reserves, on the node's memory.
	MaxSharedMemorySize *resource.Quantity `json:"maxSharedMemorySize,omitempty"`
}

// Route is a route through the share's interface.
type Route struct {
	// Destination in CIDR form; "default" for the default route.
	Destination string `json:"destination"`
	// Gateway, when set, is the next hop.
	Gateway string `json:"gateway,omitempty"`
}

// Kinds of this group, as they appear in the kind field.
const (
	DeviceConfigKind  = "DeviceConfig"
	NetworkConfigKind = "NetworkConfig"
	GPUConfigKind     = "GPUConfig"
)
