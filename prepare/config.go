package prepare

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/carve-dra/carve/prepare/api/v1alpha1"

	"github.com/carve-dra/carve/slices/names"
)

// EffectiveConfig is the configuration of one allocation after precedence:
// for each kind of config, the one that applies last wins. It is stored in
// the checkpoint with the allocation, and handed to the preparer.
type EffectiveConfig struct {
	Device  *v1alpha1.DeviceConfig  `json:"device,omitempty"`
	Network *v1alpha1.NetworkConfig `json:"network,omitempty"`
	GPU     *v1alpha1.GPUConfig     `json:"gpu,omitempty"`
}

// DeviceEnv is the DeviceConfig's Env as sorted NAME=value strings.
func (c EffectiveConfig) DeviceEnv() []string {
	if c.Device == nil {
		return nil
	}
	out := make([]string, 0, len(c.Device.Env))
	for k, v := range c.Device.Env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// configKinds says which device kinds each config kind applies to; nil means
// all.
var configKinds = map[string][]string{
	v1alpha1.DeviceConfigKind:  nil,
	v1alpha1.NetworkConfigKind: {names.KindNIC},
	v1alpha1.GPUConfigKind:     {names.KindGPU},
}

// decodeConfig decodes one opaque parameter through the API's scheme and
// checks that it applies to a device of deviceKind. Errors name the field,
// prefixed by path.
func decodeConfig(raw []byte, deviceKind string, path *field.Path, into *EffectiveConfig) error {
	obj, err := v1alpha1.Decode(raw, path)
	if err != nil {
		return err
	}
	kind := obj.GetObjectKind().GroupVersionKind().Kind
	if kinds := configKinds[kind]; kinds != nil && !slices.Contains(kinds, deviceKind) {
		return field.Invalid(path.Child("kind"), kind, fmt.Sprintf("applies to %s devices, not to a %s device", strings.Join(kinds, ", "), deviceKind))
	}
	switch c := obj.(type) {
	case *v1alpha1.DeviceConfig:
		into.Device = c
	case *v1alpha1.NetworkConfig:
		into.Network = c
	case *v1alpha1.GPUConfig:
		into.GPU = c
	}
	return nil
}

// claimNetworkFields are the NetworkConfig fields a claim may set: how the
// share looks inside the pod, which of the node's address pools (the
// node config's allowlist) it draws from, and how far it borrows (its
// ceilings, within its class's maxCeiling). Everything that touches the
// physical network (mode, VLAN, static addresses, routes) is the admin's,
// set in the DeviceClass.
var claimNetworkFields = []string{"apiVersion", "kind", "interfaceName", "mtu", "pools", "egressCeiling", "ingressCeiling"}

// effectiveConfig resolves the configuration of one allocation result. The
// allocation lists class configs before claim configs; for each config kind
// the last one that applies to the request wins, so a claim overrides its
// class, and a later entry an earlier one. A claim's NetworkConfig may set
// only claimNetworkFields; it overrides those fields of the class's and
// keeps the rest.
func effectiveConfig(driver string, configs []resourceapi.DeviceAllocationConfiguration, request, deviceKind string) (json.RawMessage, error) {
	var eff EffectiveConfig
	var fromClaim *v1alpha1.NetworkConfig
	var fromClaimDevice *v1alpha1.DeviceConfig
	var claimDevicePath *field.Path
	var claimFields map[string]json.RawMessage
	var claimPath *field.Path
	for i, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != driver || !appliesTo(c.Requests, request) {
			continue
		}
		path := field.NewPath("status", "allocation", "devices", "config").Index(i).Child("opaque", "parameters")
		into := &eff
		var own EffectiveConfig
		if c.Source == resourceapi.AllocationConfigSourceClaim {
			into = &own
		}
		if err := decodeConfig(c.Opaque.Parameters.Raw, deviceKind, path, into); err != nil {
			// Source is FromClass or FromClaim.
			return nil, fmt.Errorf("config from %s: %w", strings.ToLower(strings.TrimPrefix(string(c.Source), "From")), err)
		}
		if own.Device != nil {
			if own.Device.ClaimEnv != nil {
				return nil, fmt.Errorf("config from claim: %w", field.Forbidden(path.Child("claimEnv"),
					"set by the DeviceClass (the admin), not the claim"))
			}
			fromClaimDevice, claimDevicePath = own.Device, path
		}
		if own.GPU != nil {
			if own.GPU.MaxSharedMemorySize != nil {
				return nil, fmt.Errorf("config from claim: %w", field.Forbidden(path.Child("maxSharedMemorySize"),
					"set by the DeviceClass (the admin), not the claim"))
			}
			// The claim's own /dev/shm, whose pages its pods are
			// charged for: the claim's to size, over its class's
			// size, within its class's bound (checked at prepare,
			// where the agent's default bound is known).
			merged := own.GPU.DeepCopy()
			if eff.GPU != nil {
				merged.MaxSharedMemorySize = eff.GPU.MaxSharedMemorySize
			}
			eff.GPU = merged
		}
		if own.Network != nil {
			fields := map[string]json.RawMessage{}
			_ = json.Unmarshal(c.Opaque.Parameters.Raw, &fields)
			for name := range fields {
				if !slices.Contains(claimNetworkFields, name) {
					return nil, fmt.Errorf("config from claim: %w", field.Forbidden(path.Child(name),
						"set by the DeviceClass (the admin), not the claim: a claim may set "+strings.Join(claimNetworkFields[2:], ", ")))
				}
			}
			fromClaim, claimFields, claimPath = own.Network, fields, path
		}
	}
	if fromClaimDevice != nil {
		var classEnv []string
		if eff.Device != nil {
			classEnv = eff.Device.ClaimEnv
		}
		if err := checkClaimEnv(fromClaimDevice.Env, classEnv, claimDevicePath); err != nil {
			return nil, fmt.Errorf("config from claim: %w", err)
		}
		// A claim adds to its class's environment; where both set a
		// variable, the class's (the admin's) wins.
		merged := fromClaimDevice.DeepCopy()
		if eff.Device != nil {
			if merged.Env == nil {
				merged.Env = map[string]string{}
			}
			maps.Copy(merged.Env, eff.Device.Env)
		}
		eff.Device = merged
	}
	if fromClaim != nil {
		if _, ok := claimFields["pools"]; ok {
			// Pools belong to classes: a claim chooses among the
			// pools its class names, and a class that names none
			// leaves it none.
			var allowed []string
			if eff.Network != nil {
				allowed = append(slices.Clone(eff.Network.Pools), eff.Network.AllowedPools...)
			}
			for i, name := range fromClaim.Pools {
				if slices.Contains(allowed, name) {
					continue
				}
				why := fmt.Sprintf("pool %q is not one the DeviceClass allows (%s)", name, strings.Join(allowed, ", "))
				if len(allowed) == 0 {
					why = fmt.Sprintf("pool %q: the DeviceClass allows its claims no address pool (its NetworkConfig names none in pools or allowedPools)", name)
				}
				return nil, fmt.Errorf("config from claim: %w", field.Forbidden(claimPath.Child("pools").Index(i), why))
			}
		}
		base := fromClaim
		if eff.Network != nil {
			base = eff.Network.DeepCopy()
			if _, ok := claimFields["interfaceName"]; ok {
				base.InterfaceName = fromClaim.InterfaceName
			}
			if _, ok := claimFields["mtu"]; ok {
				base.MTU = fromClaim.MTU
			}
			if _, ok := claimFields["pools"]; ok {
				base.Pools = fromClaim.Pools
			}
			// The claim's ceilings, checked against the class's
			// maxCeiling at prepare, where the link's capacity is
			// known.
			if _, ok := claimFields["egressCeiling"]; ok {
				base.EgressCeiling = fromClaim.EgressCeiling
			}
			if _, ok := claimFields["ingressCeiling"]; ok {
				base.IngressCeiling = fromClaim.IngressCeiling
			}
		}
		eff.Network = base
	}
	if eff.Device == nil && eff.Network == nil && eff.GPU == nil {
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
	return slices.Contains(requests, request) || slices.Contains(requests, parent)
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

// checkClaimEnv checks the variables a claim adds (env) against its
// class's claimEnv: where the class lists names, only those; where it lists
// none, any but the code-loading families (v1alpha1.CodeHookEnv), which are
// the admin's. Errors are under path.
func checkClaimEnv(env map[string]string, classAllows []string, path *field.Path) error {
	for _, name := range slices.Sorted(maps.Keys(env)) {
		p := path.Child("env").Key(name)
		if classAllows != nil {
			if len(classAllows) == 0 {
				return field.Forbidden(p, "the DeviceClass lets its claims set no variable (its claimEnv is empty)")
			}
			if !slices.Contains(classAllows, name) {
				return field.Forbidden(p, "the DeviceClass lets its claims set only "+strings.Join(classAllows, ", ")+" (its claimEnv)")
			}
			continue
		}
		if family := v1alpha1.CodeHookEnv(name); family != "" {
			// They change what code a container runs.
			return field.Forbidden(p, family+" variables may be set by the DeviceClass (the admin), not the claim, "+
				"unless the class lists the name in its claimEnv")
		}
	}
	return nil
}
