// Package netdev prepares network claims: a share of a parent NIC, given to
// a pod as its own interface.
package netdev

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices"
)

// Preparer prepares NIC allocations. It checks the parent's link and the
// claim's network config and tells the container its share and interface.
// Creating the share's macvlan/ipvlan interface and enforcing its bandwidth
// build on this in the network issue.
type Preparer struct{}

func (Preparer) Prepare(_ context.Context, a prepare.Allocation, dev slices.Entry) (prepare.Prepared, error) {
	if dev.NIC == nil {
		return prepare.Prepared{}, fmt.Errorf("device %s is not a NIC", a.Device)
	}
	cfg, err := prepare.DecodeEffectiveConfig(a.Config)
	if err != nil {
		return prepare.Prepared{}, fmt.Errorf("NIC %s: config: %w", a.Device, err)
	}
	ifName := "net1"
	mtu := dev.NIC.MTU
	if cfg.Network != nil {
		if cfg.Network.InterfaceName != "" {
			ifName = cfg.Network.InterfaceName
		}
		if cfg.Network.MTU != 0 {
			if dev.NIC.MTU > 0 && cfg.Network.MTU > dev.NIC.MTU {
				return prepare.Prepared{}, fmt.Errorf("NIC %s: mtu %d is larger than the parent %s's %d", a.Device, cfg.Network.MTU, dev.NIC.Name, dev.NIC.MTU)
			}
			mtu = cfg.Network.MTU
		}
	}
	p := a.EnvPrefix()
	env := []string{p + "PARENT=" + dev.NIC.Name, p + "INTERFACE=" + ifName, p + "MTU=" + strconv.Itoa(mtu)}
	return prepare.Prepared{Edits: cdispec.ContainerEdits{Env: env}}, nil
}

func (Preparer) Unprepare(context.Context, prepare.Allocation, json.RawMessage) error { return nil }
