package nodeconfig

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/carve-dra/carve/slices/names"
)

// The NodeConfig file's apiVersion and kind, and the driver name it
// defaults to.
const (
	APIVersion        = "carve.dev/v1alpha1"
	Kind              = "NodeConfig"
	DefaultDriverName = "carve.dev"
)

// NodeConfig is the node's configuration file.
type NodeConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// DriverName is the DRA driver name the slices are published under.
	DriverName string `json:"driverName,omitempty"`
	Netdev     Netdev `json:"netdev,omitempty"`
	// RequestPolicies set how shares of a device kind may be requested,
	// by kind ("nic", "llc", "gpu") and capacity name.
	RequestPolicies map[string]map[string]RequestPolicy `json:"requestPolicies,omitempty"`
	// Health sets how unhealthy devices are tainted and when the taint
	// clears.
	Health Health `json:"health,omitempty"`
}

// Netdev selects the netdevs to publish and fills in what the kernel does
// not know about them.
type Netdev struct {
	// Include keeps only interfaces matching one of these globs, when set.
	Include []string `json:"include,omitempty"`
	// Exclude drops interfaces matching one of these globs.
	Exclude []string `json:"exclude,omitempty"`
	// IncludeVirtual publishes veth, bridges and other virtual netdevs.
	IncludeVirtual bool `json:"includeVirtual,omitempty"`
	// Bandwidth gives the capacity of links: needed where the kernel
	// reports no speed (virtio), and where set it wins over the speed the
	// kernel reports (a port shaped upstream, a veth's nominal 10G). The
	// first entry whose glob matches wins.
	Bandwidth []InterfaceBandwidth `json:"bandwidth,omitempty"`
	// Pools are the node's address pools that network claims take
	// addresses from (NetworkConfig.pools).
	Pools []AddressPool `json:"pools,omitempty"`
	// MaxSharesPerNIC caps how many shares each NIC holds at once
	// (DefaultMaxSharesPerNIC when unset): its "shares" capacity is at
	// most this, and prepare refuses a share past it.
	MaxSharesPerNIC *int64 `json:"maxSharesPerNIC,omitempty"`
	// UnsharedFloorPercent, 1 to 50, gives the traffic of no limited
	// share on a NIC (the node's own, unshaped pods', unlimited shares')
	// a class of its own beside the shares, assured this part of the
	// link and borrowing up to all of it: shares that borrow then never
	// eat into it, nor it into their floors, which the NIC's published
	// capacity leaves that part out of (a 10G link with 5 publishes 9.5G
	// each way; the link class stays 10G). It costs that traffic a trip
	// through the NIC's egress shaper and IFB, and holds it to the NIC's
	// published capacity (netdev's TestUnsharedTrafficHasItsClass). 0 (the
	// default): that traffic bypasses them, as ever, and a link it fills
	// may leave the shares less than their floors. Applies to a NIC's
	// shaper and IFB as carve makes them.
	UnsharedFloorPercent int `json:"unsharedFloorPercent,omitempty"`
}

// DefaultMaxSharesPerNIC is netdev.maxSharesPerNIC when the file does not
// set it: so many pods of one namespace could not fill a 25G NIC's 25,000
// one-Mbit/s shares and with them the node's classifier.
const DefaultMaxSharesPerNIC = 256

// AddressPool is a range of addresses handed out one per share.
type AddressPool struct {
	Name string `json:"name"`
	// CIDR is the pool's subnet; addresses are given with its prefix
	// length. The network and broadcast addresses and the gateway are
	// never handed out.
	CIDR string `json:"cidr"`
	// Gateway is left out of the pool.
	Gateway string `json:"gateway,omitempty"`
	// Parent and VLAN bind the pool to the segment its subnet lives on:
	// a share of another parent (by interface name) or VLAN is refused
	// its addresses. An empty Parent leaves the pool to every parent;
	// VLAN 0 is the untagged segment.
	Parent string `json:"parent,omitempty"`
	VLAN   int    `json:"vlan,omitempty"`
	// Scope says who else hands out the pool's addresses: Cluster (the
	// default) where its subnet is a segment other nodes share, and each
	// address is recorded in the API server as its share's before the
	// share gets it (package netdev/addrbook); Node where the subnet is
	// this node's alone (a segment no other node reaches, or a pool with a
	// CIDR of its own on each node), and the agent hands its addresses out
	// by itself.
	Scope PoolScope `json:"scope,omitempty"`
}

// PoolScope is an address pool's Scope.
type PoolScope string

// The scopes: each address once in the cluster, or the node's own.
const (
	PoolScopeCluster PoolScope = "Cluster"
	PoolScopeNode    PoolScope = "Node"
)

// ClusterWide says whether the pool's addresses are recorded cluster-wide.
func (p AddressPool) ClusterWide() bool { return p.Scope != PoolScopeNode }

// Admits says why the pool refuses a share on parent and VLAN, "" where it
// takes it.
func (p AddressPool) Admits(parent string, vlan int) string {
	if (p.Parent != "" && p.Parent != parent) || p.VLAN != vlan {
		return fmt.Sprintf("address pool %q is bound to parent %s VLAN %d, and this share is on parent %s VLAN %d",
			p.Name, orAny(p.Parent), p.VLAN, parent, vlan)
	}
	return ""
}

func orAny(s string) string {
	if s == "" {
		return "(any)"
	}
	return s
}

// InterfaceBandwidth is the capacity of matching interfaces, in bits per
// second, as quantities ("10G", "25Gi" is not meant: use decimal).
type InterfaceBandwidth struct {
	Interface string   `json:"interface"`
	Egress    Quantity `json:"egress"`
	Ingress   Quantity `json:"ingress,omitempty"`
}

// RequestPolicy is a capacity's request policy: what a claim that does not
// ask gets, and the range and granularity of what it may ask.
type RequestPolicy struct {
	Default Quantity `json:"default"`
	Min     Quantity `json:"min,omitempty"`
	Max     Quantity `json:"max,omitempty"`
	Step    Quantity `json:"step,omitempty"`
}

// Quantity is a resource quantity as written in the file, "10G" or 2. It is
// kept as text so that a bad value is reported with its field path by
// Validate rather than as an anonymous decoding error.
type Quantity string

// UnmarshalJSON takes a JSON string or number.
func (q *Quantity) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*q = Quantity(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("want a quantity such as \"10G\" or 2, got %s", b)
	}
	*q = Quantity(n)
	return nil
}

// Policy is a RequestPolicy with its quantities parsed.
type Policy struct {
	Default resource.Quantity
	Min     *resource.Quantity
	Max     *resource.Quantity
	Step    *resource.Quantity
}

// Default returns the configuration used when no file is given.
func Default() *NodeConfig {
	return &NodeConfig{APIVersion: APIVersion, Kind: Kind, DriverName: DefaultDriverName}
}

// Load reads and decodes a NodeConfig file; an empty path gives Default().
func Load(file string) (*NodeConfig, error) {
	if file == "" {
		return Default(), nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read node config: %w", err)
	}
	cfg, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("node config %s: %w", file, err)
	}
	return cfg, nil
}

// Decode strictly decodes a NodeConfig from YAML or JSON: an unknown field,
// a duplicate key or a bad value is an error naming its path.
func Decode(data []byte) (*NodeConfig, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	cfg := &NodeConfig{}
	strictErrs, err := sigsjson.UnmarshalStrict(js, cfg, sigsjson.DisallowUnknownFields)
	if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, len(strictErrs))
		for i, e := range strictErrs {
			msgs[i] = e.Error()
		}
		return nil, fmt.Errorf("decode: %s", strings.Join(msgs, "; "))
	}
	if cfg.DriverName == "" {
		cfg.DriverName = DefaultDriverName
	}
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return cfg, nil
}

// Kinds whose capacities may carry a request policy, and those capacities.
var policyCapacities = map[string][]string{
	names.KindNIC: {names.CapEgressBandwidth, names.CapIngressBandwidth},
	names.KindLLC: {names.CapWays, names.CapSize},
	// gpu memory slices, where the GPU's memoryEnforcement is not none.
	names.KindGPU: {names.CapMemory},
}

// Validate checks every field and returns all that are wrong, by path.
func (c *NodeConfig) Validate() field.ErrorList {
	var errs field.ErrorList
	if c.APIVersion != APIVersion {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), c.APIVersion, "must be "+APIVersion))
	}
	if c.Kind != Kind {
		errs = append(errs, field.Invalid(field.NewPath("kind"), c.Kind, "must be "+Kind))
	}
	if len(c.DriverName) > 63 {
		errs = append(errs, field.TooLong(field.NewPath("driverName"), c.DriverName, 63))
	}
	for _, msg := range validation.IsDNS1123Subdomain(c.DriverName) {
		errs = append(errs, field.Invalid(field.NewPath("driverName"), c.DriverName, msg))
	}
	errs = append(errs, c.Health.validate(field.NewPath("health"))...)
	nd := field.NewPath("netdev")
	for name, globs := range map[string][]string{"include": c.Netdev.Include, "exclude": c.Netdev.Exclude} {
		for i, g := range globs {
			if _, err := path.Match(g, ""); err != nil {
				errs = append(errs, field.Invalid(nd.Child(name).Index(i), g, "bad glob: "+err.Error()))
			}
		}
	}
	for i, bw := range c.Netdev.Bandwidth {
		p := nd.Child("bandwidth").Index(i)
		if bw.Interface == "" {
			errs = append(errs, field.Required(p.Child("interface"), "an interface name or glob"))
		} else if _, err := path.Match(bw.Interface, ""); err != nil {
			errs = append(errs, field.Invalid(p.Child("interface"), bw.Interface, "bad glob: "+err.Error()))
		}
		if bw.Egress == "" {
			errs = append(errs, field.Required(p.Child("egress"), "bits per second, e.g. 10G"))
		} else {
			errs = append(errs, positiveQuantity(p.Child("egress"), string(bw.Egress))...)
		}
		if bw.Ingress != "" {
			errs = append(errs, positiveQuantity(p.Child("ingress"), string(bw.Ingress))...)
		}
	}
	if m := c.Netdev.MaxSharesPerNIC; m != nil && *m < 1 {
		errs = append(errs, field.Invalid(nd.Child("maxSharesPerNIC"), *m, "must be at least 1"))
	}
	if u := c.Netdev.UnsharedFloorPercent; u < 0 || u > 50 {
		errs = append(errs, field.Invalid(nd.Child("unsharedFloorPercent"), u, "must be between 0 (off) and 50"))
	}
	poolNames := map[string]bool{}
	for i, p := range c.Netdev.Pools {
		pp := nd.Child("pools").Index(i)
		if p.Name == "" {
			errs = append(errs, field.Required(pp.Child("name"), "a name claims refer to"))
		} else if poolNames[p.Name] {
			errs = append(errs, field.Duplicate(pp.Child("name"), p.Name))
		}
		poolNames[p.Name] = true
		prefix, err := netip.ParsePrefix(p.CIDR)
		if err != nil {
			errs = append(errs, field.Invalid(pp.Child("cidr"), p.CIDR, "not a CIDR, e.g. 10.20.0.0/24"))
			continue
		}
		if p.Gateway != "" {
			if gw, err := netip.ParseAddr(p.Gateway); err != nil || !prefix.Contains(gw) {
				errs = append(errs, field.Invalid(pp.Child("gateway"), p.Gateway, "not an address inside "+p.CIDR))
			}
		}
		if p.VLAN < 0 || p.VLAN > 4094 {
			errs = append(errs, field.Invalid(pp.Child("vlan"), p.VLAN, "must be between 0 (untagged) and 4094"))
		}
		if p.Scope != "" && p.Scope != PoolScopeCluster && p.Scope != PoolScopeNode {
			errs = append(errs, field.NotSupported(pp.Child("scope"), p.Scope, []PoolScope{PoolScopeCluster, PoolScopeNode}))
		}
	}
	rp := field.NewPath("requestPolicies")
	for kind, byCap := range c.RequestPolicies {
		caps, ok := policyCapacities[kind]
		if !ok {
			errs = append(errs, field.NotSupported(rp.Key(kind), kind, []string{names.KindNIC, names.KindLLC, names.KindGPU}))
			continue
		}
		for capName, pol := range byCap {
			p := rp.Key(kind).Key(capName)
			if !slices.Contains(caps, capName) {
				errs = append(errs, field.NotSupported(p, capName, caps))
				continue
			}
			if _, perrs := pol.parse(p); len(perrs) > 0 {
				errs = append(errs, perrs...)
			}
		}
	}
	return errs
}

func positiveQuantity(p *field.Path, s string) field.ErrorList {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return field.ErrorList{field.Invalid(p, s, "not a quantity: "+err.Error())}
	}
	if q.Sign() <= 0 {
		return field.ErrorList{field.Invalid(p, s, "must be greater than zero")}
	}
	return nil
}

func (r RequestPolicy) parse(p *field.Path) (Policy, field.ErrorList) {
	var errs field.ErrorList
	var pol Policy
	parse := func(name string, text Quantity, required bool) *resource.Quantity {
		s := string(text)
		if s == "" {
			if required {
				errs = append(errs, field.Required(p.Child(name), "a quantity"))
			}
			return nil
		}
		if e := positiveQuantity(p.Child(name), s); len(e) > 0 {
			errs = append(errs, e...)
			return nil
		}
		q := resource.MustParse(s)
		return &q
	}
	if d := parse("default", r.Default, true); d != nil {
		pol.Default = *d
	}
	pol.Min, pol.Max, pol.Step = parse("min", r.Min, false), parse("max", r.Max, false), parse("step", r.Step, false)
	if len(errs) > 0 {
		return Policy{}, errs
	}
	if pol.Min != nil && pol.Default.Cmp(*pol.Min) < 0 {
		errs = append(errs, field.Invalid(p.Child("default"), string(r.Default), "must not be less than min "+string(r.Min)))
	}
	if pol.Max != nil && pol.Default.Cmp(*pol.Max) > 0 {
		errs = append(errs, field.Invalid(p.Child("default"), string(r.Default), "must not be more than max "+string(r.Max)))
	}
	if pol.Min != nil && pol.Max != nil && pol.Min.Cmp(*pol.Max) > 0 {
		errs = append(errs, field.Invalid(p.Child("min"), string(r.Min), "must not be more than max "+string(r.Max)))
	}
	return pol, errs
}

// Policy returns the configured request policy for a kind's capacity.
func (c *NodeConfig) Policy(kind, capacity string) (Policy, bool) {
	r, ok := c.RequestPolicies[kind][capacity]
	if !ok {
		return Policy{}, false
	}
	pol, errs := r.parse(field.NewPath("requestPolicies", kind, capacity))
	return pol, len(errs) == 0
}

// SharesPerNIC is the most shares a NIC may hold at once by the node
// config: netdev.maxSharesPerNIC, else (or without a config)
// DefaultMaxSharesPerNIC.
func (c *NodeConfig) SharesPerNIC() int64 {
	if c != nil && c.Netdev.MaxSharesPerNIC != nil {
		return *c.Netdev.MaxSharesPerNIC
	}
	return DefaultMaxSharesPerNIC
}

// Pool returns the address pool of that name.
func (c *NodeConfig) Pool(name string) (AddressPool, bool) {
	for _, p := range c.Netdev.Pools {
		if p.Name == name {
			return p, true
		}
	}
	return AddressPool{}, false
}

// BandwidthFor returns the configured egress and ingress capacity (bits/s)
// of an interface, when an entry matches it. Ingress defaults to egress.
func (c *NodeConfig) BandwidthFor(ifName string) (egress, ingress resource.Quantity, ok bool) {
	for _, bw := range c.Netdev.Bandwidth {
		if m, _ := path.Match(bw.Interface, ifName); !m {
			continue
		}
		egress, err := resource.ParseQuantity(string(bw.Egress))
		if err != nil {
			return resource.Quantity{}, resource.Quantity{}, false
		}
		ingress = egress
		if bw.Ingress != "" {
			if ingress, err = resource.ParseQuantity(string(bw.Ingress)); err != nil {
				return resource.Quantity{}, resource.Quantity{}, false
			}
		}
		return egress, ingress, true
	}
	return resource.Quantity{}, resource.Quantity{}, false
}
