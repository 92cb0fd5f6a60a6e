package netdev

import "github.com/carve-dra/carve/prepare/api/v1alpha1"

// net1Mode is the interface mode a config asks for: the macvlan or ipvlan
// mode, defaulted as the API defaults it.
func net1Mode(cfg v1alpha1.NetworkConfig) string {
	if cfg.Mode == "ipvlan" {
		if cfg.IPVlanMode == "" {
			return "ipvlan-l2"
		}
		return "ipvlan-" + cfg.IPVlanMode
	}
	if cfg.MacvlanMode == "" {
		// As the API defaults it: nothing a share sends can bypass the
		// parent's shaper (see prepare).
		return "macvlan-vepa"
	}
	return "macvlan-" + cfg.MacvlanMode
}
