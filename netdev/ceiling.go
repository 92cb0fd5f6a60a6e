package netdev

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/carve-dra/carve/prepare/api/v1alpha1"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

// Work-conserving shares (issue 42). A share's consumed egressBandwidth and
// ingressBandwidth are its floor: the scheduler keeps the floors on a NIC
// within what it publishes, and each share's HTB class is assured its floor
// (its rate). A share of a class that allows borrowing (maxCeiling) also has
// a ceiling per direction (its class's ceil): while the link has idle
// capacity, the share borrows it, up to the ceiling. The share classes of a
// device hang from one link class (linkMinor) held to the NIC's capacity, from
// which they borrow. What the floors leave of the link is assured to the
// borrowers in proportion to their floors, by their classes' rates
// (excess.go: two of 100M and 300M alone on a 1G link are assured 250M and
// 750M); what a share leaves idle goes to the others that want it, lent
// round-robin a quantum at a time, each class's quantum (its flow
// children's, which HTB lends to) in proportion to its floor.
// A share without a ceiling has rate = ceil = floor: a hard cap, as before.

// classRates are a share class's floor (HTB rate) and ceiling (ceil), bits/s.
type classRates struct{ floor, ceil uint64 }

// hardCap is a class held to rate: no borrowing.
func hardCap(rate uint64) classRates { return classRates{floor: rate, ceil: rate} }

// borrows reports whether the class may go past its floor.
func (r classRates) borrows() bool { return r.ceil > r.floor }

// ceilings resolves the share's ceilings for its floors (0: no class in that
// direction) on a NIC of the link rates egressLink and ingressLink (bits/s,
// 0 unknown): each the claim's, else the class's maxCeiling, where
// the class sets one; the floor (a hard cap) where it does not. A ceiling
// below the floor, over the class's maxCeiling or over the NIC's capacity,
// or set where the class allows no borrowing, is refused, naming the field.
func ceilings(cfg v1alpha1.NetworkConfig, egressLink, ingressLink, egress, ingress uint64) (eg, in classRates, err error) {
	resolve := func(field, v string, floor uint64, capName resourceapi.QualifiedName) (classRates, error) {
		if floor == 0 {
			return classRates{}, nil
		}
		link := map[resourceapi.QualifiedName]uint64{names.CapEgressBandwidth: egressLink, names.CapIngressBandwidth: ingressLink}[capName]
		if cfg.MaxCeiling == "" {
			if v != "" {
				return classRates{}, fmt.Errorf("NetworkConfig %s %s: the DeviceClass lets its claims borrow nothing (its NetworkConfig sets no maxCeiling)", field, v)
			}
			return hardCap(floor), nil
		}
		maxBits, err := ceilingBits(cfg.MaxCeiling, link)
		if err != nil {
			return classRates{}, fmt.Errorf("NetworkConfig maxCeiling %s: %w", cfg.MaxCeiling, err)
		}
		ceil := maxBits
		if v != "" {
			if ceil, err = ceilingBits(v, link); err != nil {
				return classRates{}, fmt.Errorf("NetworkConfig %s %s: %w", field, v, err)
			}
		}
		switch {
		case ceil < floor:
			return classRates{}, fmt.Errorf("NetworkConfig %s %s (%d bit/s) is below the share's %s of %d bit/s, its floor", field, orDefault(v, cfg.MaxCeiling), ceil, capName, floor)
		case ceil > maxBits:
			return classRates{}, fmt.Errorf("NetworkConfig %s %s (%d bit/s) is over the DeviceClass's maxCeiling %s (%d bit/s)", field, v, ceil, cfg.MaxCeiling, maxBits)
		case link > 0 && ceil > link:
			return classRates{}, fmt.Errorf("NetworkConfig %s %s (%d bit/s) is over the NIC's %s of %d bit/s", field, orDefault(v, cfg.MaxCeiling), ceil, capName, link)
		}
		return classRates{floor: floor, ceil: ceil}, nil
	}
	if eg, err = resolve("egressCeiling", cfg.EgressCeiling, egress, names.CapEgressBandwidth); err != nil {
		return classRates{}, classRates{}, err
	}
	if in, err = resolve("ingressCeiling", cfg.IngressCeiling, ingress, names.CapIngressBandwidth); err != nil {
		return classRates{}, classRates{}, err
	}
	return eg, in, nil
}

// ceilingBits is a ceiling in bits/s; "link" is the NIC's capacity, which
// must be known.
func ceilingBits(v string, link uint64) (uint64, error) {
	bits, err := v1alpha1.ParseCeiling(v)
	if err != nil {
		return 0, err
	}
	if bits == 0 {
		if link == 0 {
			return 0, fmt.Errorf("%q: the NIC's capacity is not known", v1alpha1.CeilingLink)
		}
		return link, nil
	}
	return uint64(bits), nil
}

// linkRate is the NIC's link rate in a direction (capName), bits/s, 0 where
// unknown: its published capacity, less the part the node config assures
// the traffic of no share (unsharedFloorPercent, which the published
// capacity leaves out: slices.Build), added back. It is the link class's
// rate, and a "link" ceiling.
func (p *NICPreparer) linkRate(dev slices.Entry, capName resourceapi.QualifiedName) uint64 {
	c, pct := capacityOf(dev, capName), p.unsharedPercent()
	if pct == 0 || c == 0 {
		return c
	}
	return c/(100-pct)*100 + c%(100-pct)*100/(100-pct)
}

// capacityOf is the NIC's published capacity name in bits/s, 0 where none.
func capacityOf(dev slices.Entry, name resourceapi.QualifiedName) uint64 {
	c, ok := dev.Device.Capacity[name]
	if !ok || c.Value.Sign() <= 0 {
		return 0
	}
	return uint64(c.Value.Value())
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
