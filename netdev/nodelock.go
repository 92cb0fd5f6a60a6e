package netdev

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
)

// lockNode takes the node-wide lock on NIC host work: every agent on the
// node (two during a rolling update) prepares and unprepares shares one at a
// time under it, so that class numbers and pool addresses, which each agent
// picks from what it sees, are never picked twice. It returns the unlock.
func (p *NICPreparer) lockNode() (func(), error) {
	path := filepath.Join(p.opts.StateDir, "netdev", ".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the node's NIC lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the node's NIC work: %w", err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// reserveAddressesOnDisk marks as used every address that an attach spec on
// the node holds: those another agent handed out are in no memory of this
// one. The caller holds the node lock, so the specs are complete.
func (p *NICPreparer) reserveAddressesOnDisk() error {
	specs, err := p.specs()
	if err != nil {
		return err
	}
	for _, spec := range specs {
		var addrs []netip.Prefix
		for _, s := range spec.Addresses {
			if pfx, err := netip.ParsePrefix(s); err == nil {
				addrs = append(addrs, pfx)
			}
		}
		if len(addrs) > 0 && spec.ClaimUID != "" {
			p.ipam.reserveFree(allocationOf(spec).ShareKey(), addrs)
		}
	}
	return nil
}
