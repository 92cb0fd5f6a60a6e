package v1alpha1

import (
	"slices"

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
	// different sizes, the largest holds. Between 1Mi and 1Ti.
	SharedMemorySize *resource.Quantity `json:"sharedMemorySize,omitempty"`
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
