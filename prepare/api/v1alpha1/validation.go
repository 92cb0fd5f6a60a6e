package v1alpha1

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// reservedInterfaceNames are the pod's own: the loopback and the interface
// the cluster's CNI gives every pod.
var reservedInterfaceNames = []string{"lo", "eth0"}

var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ReservedEnvPrefixes are the variables carve's preparers set: CARVE_*
// describes the allocation, CUDA_MPS_* and NVIDIA_* tie a container to its
// GPU share (its MPS daemon, its ceiling, its devices). No config may set
// them, or a container would misread its allocation or escape its slice.
var ReservedEnvPrefixes = []string{"CARVE_", "CUDA_MPS_", "NVIDIA_"}

// ValidateDeviceConfig checks a DeviceConfig; errors are under path.
func ValidateDeviceConfig(c *DeviceConfig, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, name := range c.ClaimEnv {
		if !envNamePattern.MatchString(name) {
			errs = append(errs, field.Invalid(path.Child("claimEnv").Index(i), name, "not an environment variable name"))
		} else if reservedEnv(name) != "" {
			errs = append(errs, field.Forbidden(path.Child("claimEnv").Index(i), reservedEnv(name)+"* variables are set by carve"))
		}
	}
	for name, value := range c.Env {
		switch {
		case !envNamePattern.MatchString(name):
			errs = append(errs, field.Invalid(path.Child("env").Key(name), name, "not an environment variable name"))
		case reservedEnv(name) != "":
			errs = append(errs, field.Forbidden(path.Child("env").Key(name), reservedEnv(name)+"* variables are set by carve"))
		case hasControl(value):
			// The runtime would hand them to the process as they are.
			errs = append(errs, field.Invalid(path.Child("env").Key(name), value, "control characters are not allowed in a value"))
		}
	}
	return errs
}

// Bounds of GPUConfig.SharedMemorySize.
const (
	MinSharedMemorySize = 1 << 20
	MaxSharedMemorySize = 1 << 40
)

// ValidateGPUConfig checks a GPUConfig; errors are under path.
func ValidateGPUConfig(c *GPUConfig, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for name, q := range map[string]*resource.Quantity{"sharedMemorySize": c.SharedMemorySize, "maxSharedMemorySize": c.MaxSharedMemorySize} {
		if q == nil {
			continue
		}
		p := path.Child(name)
		v, exact := q.AsInt64()
		switch {
		case !exact:
			errs = append(errs, field.Invalid(p, q.String(), "not a whole number of bytes"))
		case v < MinSharedMemorySize || v > MaxSharedMemorySize:
			errs = append(errs, field.Invalid(p, q.String(), "must be between 1Mi and 1Ti"))
		}
	}
	return errs
}

// reservedEnv is the reserved prefix name starts with, "" where none.
func reservedEnv(name string) string {
	for _, p := range ReservedEnvPrefixes {
		if strings.HasPrefix(strings.ToUpper(name), p) {
			return p
		}
	}
	return ""
}

// hasControl reports a control character (NUL, CR, VT, ESC...).
func hasControl(s string) bool {
	return strings.ContainsFunc(s, unicode.IsControl)
}

// ValidateInterfaceName checks a pod interface name as CNI's
// ValidateInterfaceName does (1 to 15 bytes, not "." or "..", no '/', ':'
// or white space), and refuses control characters and carve's own host-side
// prefix "cv", which would collide with share interfaces on the node.
func ValidateInterfaceName(name string) string {
	switch {
	case name == "" || len(name) > 15:
		return "must be 1 to 15 bytes long"
	case name == "." || name == "..":
		return "must not be . or .."
	case strings.ContainsFunc(name, func(r rune) bool { return r == '/' || r == ':' || unicode.IsSpace(r) || !unicode.IsPrint(r) }):
		return "must not contain '/', ':', white space or control characters"
	case strings.HasPrefix(name, "cv"):
		return "must not start with cv, carve's prefix for share interfaces on the node"
	}
	return ""
}

// ValidateNetworkConfig checks a NetworkConfig; errors are under path.
func ValidateNetworkConfig(n *NetworkConfig, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch n.Mode {
	case "", "macvlan", "ipvlan":
	default:
		errs = append(errs, field.NotSupported(path.Child("mode"), n.Mode, []string{"macvlan", "ipvlan"}))
	}
	// passthru would give one pod the whole NIC, taking it from every
	// other share and from the host: never a share's mode.
	switch n.MacvlanMode {
	case "", "bridge", "private", "vepa":
	default:
		errs = append(errs, field.NotSupported(path.Child("macvlanMode"), n.MacvlanMode, []string{"bridge", "private", "vepa"}))
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
		switch {
		case ValidateInterfaceName(n.InterfaceName) != "":
			errs = append(errs, field.Invalid(path.Child("interfaceName"), n.InterfaceName, "not an interface name: "+ValidateInterfaceName(n.InterfaceName)))
		case slices.Contains(reservedInterfaceNames, n.InterfaceName):
			errs = append(errs, field.Invalid(path.Child("interfaceName"), n.InterfaceName, "reserved for the pod's own network (the loopback and the CNI's interface)"))
		}
	}
	if n.MTU != 0 && (n.MTU < 68 || n.MTU > 65535) {
		errs = append(errs, field.Invalid(path.Child("mtu"), n.MTU, "must be between 68 and 65535"))
	}
	if n.VLAN != 0 && (n.VLAN < 1 || n.VLAN > 4094) {
		errs = append(errs, field.Invalid(path.Child("vlan"), n.VLAN, "must be between 1 and 4094"))
	}
	seen := map[netip.Addr]int{}
	for i, a := range n.Addresses {
		pfx, err := netip.ParsePrefix(a)
		if err != nil {
			errs = append(errs, field.Invalid(path.Child("addresses").Index(i), a, "not an address in CIDR form, e.g. 10.0.0.5/24"))
			continue
		}
		if j, dup := seen[pfx.Addr()]; dup {
			errs = append(errs, field.Duplicate(path.Child("addresses").Index(i), fmt.Sprintf("%s (also addresses[%d])", a, j)))
			continue
		}
		seen[pfx.Addr()] = i
	}
	for i, p := range n.Pools {
		if p == "" {
			errs = append(errs, field.Required(path.Child("pools").Index(i), "a pool name from the node config"))
		}
	}
	for name, v := range map[string]string{"egressCeiling": n.EgressCeiling, "ingressCeiling": n.IngressCeiling, "maxCeiling": n.MaxCeiling} {
		if v == "" {
			continue
		}
		if _, err := ParseCeiling(v); err != nil {
			errs = append(errs, field.Invalid(path.Child(name), v, err.Error()))
		}
	}
	for i, f := range n.OpenFamilies {
		p := path.Child("openFamilies").Index(i)
		switch {
		case f != FamilyIPv4 && f != FamilyIPv6:
			errs = append(errs, field.NotSupported(p, f, []string{FamilyIPv4, FamilyIPv6}))
		case slices.Index(n.OpenFamilies, f) < i:
			errs = append(errs, field.Duplicate(p, f))
		}
	}
	if len(n.Ethertypes) > MaxEthertypes {
		errs = append(errs, field.TooMany(path.Child("ethertypes"), len(n.Ethertypes), MaxEthertypes))
	}
	seenTypes := map[uint16]int{}
	for i, s := range n.Ethertypes {
		p := path.Child("ethertypes").Index(i)
		v, err := ParseEthertype(s)
		if err != nil {
			errs = append(errs, field.Invalid(p, s, err.Error()))
			continue
		}
		if j, dup := seenTypes[v]; dup {
			errs = append(errs, field.Duplicate(p, fmt.Sprintf("%s (also ethertypes[%d])", s, j)))
			continue
		}
		seenTypes[v] = i
	}
	for i, p := range n.AllowedPools {
		if p == "" {
			errs = append(errs, field.Required(path.Child("allowedPools").Index(i), "a pool name from the node config"))
		}
	}
	for i, r := range n.Routes {
		errs = append(errs, validateRoute(r, path.Child("routes").Index(i))...)
	}
	return errs
}

// validateRoute checks what the kernel would refuse at container start, so
// that the claim fails at prepare with the field named instead.
func validateRoute(r Route, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	var dst netip.Prefix
	if r.Destination != "default" {
		var err error
		if dst, err = netip.ParsePrefix(r.Destination); err != nil {
			return append(errs, field.Invalid(path.Child("destination"), r.Destination, "not a CIDR or \"default\""))
		}
	}
	if r.Gateway == "" {
		if r.Destination == "default" {
			errs = append(errs, field.Required(path.Child("gateway"), "a default route needs a gateway"))
		}
		return errs
	}
	gw, err := netip.ParseAddr(r.Gateway)
	if err != nil {
		return append(errs, field.Invalid(path.Child("gateway"), r.Gateway, "not an IP address"))
	}
	if dst.IsValid() && dst.Addr().Is4() != gw.Is4() {
		errs = append(errs, field.Invalid(path.Child("gateway"), r.Gateway, "not of the destination's address family ("+r.Destination+")"))
	}
	return errs
}

// ParseCeiling reads a ceiling (NetworkConfig's egressCeiling,
// ingressCeiling, maxCeiling): bits per second, or 0 for CeilingLink.
func ParseCeiling(v string) (int64, error) {
	if v == CeilingLink {
		return 0, nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, fmt.Errorf("not a quantity of bits per second (e.g. 1G) nor %q", CeilingLink)
	}
	if q.Sign() <= 0 {
		return 0, fmt.Errorf("must be more than 0 bits per second")
	}
	return q.Value(), nil
}
