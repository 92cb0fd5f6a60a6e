package prepare

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsjson "sigs.k8s.io/json"
)

// ConfigAPIVersion is the apiVersion of carve's opaque device configuration.
const ConfigAPIVersion = "carve.dev/v1alpha1"

// DeviceConfig applies to a device of any kind.
type DeviceConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Env is added to the environment of every container using the device.
	Env map[string]string `json:"env,omitempty"`
}

// EnvList is Env as sorted NAME=value strings.
func (c *DeviceConfig) EnvList() []string {
	out := make([]string, 0, len(c.Env))
	for k, v := range c.Env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// NetworkConfig configures a NIC share: the interface the pod sees.
type NetworkConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Mode is the kind of child interface: macvlan (default) or ipvlan.
	Mode string `json:"mode,omitempty"`
	// MacvlanMode is bridge (default), private, vepa or passthru.
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
	// from each; the address is released on unprepare.
	Pools []string `json:"pools,omitempty"`
	// Routes are added in the pod through this interface.
	Routes []Route `json:"routes,omitempty"`
}

// Route is a route through the share's interface.
type Route struct {
	// Destination in CIDR form; "default" for the default route.
	Destination string `json:"destination"`
	// Gateway, when set, is the next hop.
	Gateway string `json:"gateway,omitempty"`
}

func (n *NetworkConfig) validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch n.Mode {
	case "", "macvlan", "ipvlan":
	default:
		errs = append(errs, field.NotSupported(path.Child("mode"), n.Mode, []string{"macvlan", "ipvlan"}))
	}
	switch n.MacvlanMode {
	case "", "bridge", "private", "vepa", "passthru":
	default:
		errs = append(errs, field.NotSupported(path.Child("macvlanMode"), n.MacvlanMode, []string{"bridge", "private", "vepa", "passthru"}))
	}
	switch n.IPVlanMode {
	case "", "l2", "l3", "l3s":
	default:
		errs = append(errs, field.NotSupported(path.Child("ipvlanMode"), n.IPVlanMode, []string{"l2", "l3", "l3s"}))
	}
	if n.Mode == "ipvlan" && n.MacvlanMode != "" {
		errs = append(errs, field.Forbidden(path.Child("macvlanMode"), "only for mode macvlan"))
	}
	if n.Mode != "ipvlan" && n.IPVlanMode != "" {
		errs = append(errs, field.Forbidden(path.Child("ipvlanMode"), "only for mode ipvlan"))
	}
	if n.InterfaceName != "" {
		if len(n.InterfaceName) > 15 || strings.ContainsAny(n.InterfaceName, "/: \t\n") || n.InterfaceName == "." || n.InterfaceName == ".." {
			errs = append(errs, field.Invalid(path.Child("interfaceName"), n.InterfaceName, "not a Linux interface name (at most 15 characters, no '/', ':' or spaces)"))
		}
	}
	if n.MTU != 0 && (n.MTU < 68 || n.MTU > 65535) {
		errs = append(errs, field.Invalid(path.Child("mtu"), n.MTU, "must be between 68 and 65535"))
	}
	if n.VLAN != 0 && (n.VLAN < 1 || n.VLAN > 4094) {
		errs = append(errs, field.Invalid(path.Child("vlan"), n.VLAN, "must be between 1 and 4094"))
	}
	for i, a := range n.Addresses {
		if _, err := netip.ParsePrefix(a); err != nil {
			errs = append(errs, field.Invalid(path.Child("addresses").Index(i), a, "not an address in CIDR form, e.g. 10.0.0.5/24"))
		}
	}
	for i, p := range n.Pools {
		if p == "" {
			errs = append(errs, field.Required(path.Child("pools").Index(i), "a pool name from the node config"))
		}
	}
	for i, r := range n.Routes {
		rp := path.Child("routes").Index(i)
		if r.Destination != "default" {
			if _, err := netip.ParsePrefix(r.Destination); err != nil {
				errs = append(errs, field.Invalid(rp.Child("destination"), r.Destination, "not a CIDR or \"default\""))
			}
		}
		if r.Gateway != "" {
			if _, err := netip.ParseAddr(r.Gateway); err != nil {
				errs = append(errs, field.Invalid(rp.Child("gateway"), r.Gateway, "not an IP address"))
			}
		}
	}
	return errs
}

// EffectiveConfig is the configuration of one allocation after precedence:
// for each kind of config, the one that applies last wins.
type EffectiveConfig struct {
	Device  *DeviceConfig  `json:"device,omitempty"`
	Network *NetworkConfig `json:"network,omitempty"`
}

// configKinds says which device kinds each config kind applies to; nil means
// all.
var configKinds = map[string][]string{
	"DeviceConfig":  nil,
	"NetworkConfig": {"nic"},
}

var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// decodeConfig strictly decodes one opaque parameter and validates it for a
// device of deviceKind. Errors name the field, prefixed by path.
func decodeConfig(raw []byte, deviceKind string, path *field.Path, into *EffectiveConfig) error {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return fmt.Errorf("%s: not a JSON object: %w", path, err)
	}
	if head.APIVersion != ConfigAPIVersion {
		return field.Invalid(path.Child("apiVersion"), head.APIVersion, "must be "+ConfigAPIVersion)
	}
	kinds, known := configKinds[head.Kind]
	if !known {
		return field.NotSupported(path.Child("kind"), head.Kind, []string{"DeviceConfig", "NetworkConfig"})
	}
	if kinds != nil && !contains(kinds, deviceKind) {
		return field.Invalid(path.Child("kind"), head.Kind, fmt.Sprintf("applies to %s devices, not to a %s device", strings.Join(kinds, ", "), deviceKind))
	}
	var target any
	switch head.Kind {
	case "DeviceConfig":
		into.Device = &DeviceConfig{}
		target = into.Device
	case "NetworkConfig":
		into.Network = &NetworkConfig{}
		target = into.Network
	}
	strict, err := sigsjson.UnmarshalStrict(raw, target, sigsjson.DisallowUnknownFields)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return fmt.Errorf("%s: %s", path, strings.Join(msgs, "; "))
	}
	var errs field.ErrorList
	switch {
	case into.Device != nil && target == into.Device:
		for name := range into.Device.Env {
			if !envNamePattern.MatchString(name) {
				errs = append(errs, field.Invalid(path.Child("env").Key(name), name, "not an environment variable name"))
			}
		}
	case into.Network != nil && target == into.Network:
		errs = append(errs, into.Network.validate(path)...)
	}
	return errs.ToAggregate()
}

// effectiveConfig resolves the configuration of one allocation result. The
// allocation lists class configs before claim configs; for each config kind
// the last one that applies to the request wins, so a claim overrides its
// class, and a later entry an earlier one.
func effectiveConfig(driver string, configs []resourceapi.DeviceAllocationConfiguration, request, deviceKind string) (json.RawMessage, error) {
	var eff EffectiveConfig
	for i, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != driver || !appliesTo(c.Requests, request) {
			continue
		}
		path := field.NewPath("status", "allocation", "devices", "config").Index(i).Child("opaque", "parameters")
		if err := decodeConfig(c.Opaque.Parameters.Raw, deviceKind, path, &eff); err != nil {
			return nil, fmt.Errorf("config from %s: %w", strings.ToLower(string(c.Source)), err)
		}
	}
	if eff.Device == nil && eff.Network == nil {
		return nil, nil
	}
	return json.Marshal(eff)
}

// appliesTo reports whether a config's request list covers a request; an
// empty list covers all. A subrequest "req/sub" is covered by "req".
func appliesTo(requests []string, request string) bool {
	if len(requests) == 0 {
		return true
	}
	parent, _, _ := strings.Cut(request, "/")
	for _, r := range requests {
		if r == request || r == parent {
			return true
		}
	}
	return false
}

// DecodeEffectiveConfig reads an allocation's effective configuration.
func DecodeEffectiveConfig(raw json.RawMessage) (EffectiveConfig, error) {
	var eff EffectiveConfig
	if len(raw) == 0 {
		return eff, nil
	}
	err := json.Unmarshal(raw, &eff)
	return eff, err
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
