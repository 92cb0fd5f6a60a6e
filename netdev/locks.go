package netdev

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
)

// Two kinds of lock order the NIC work of every agent on the node (two run
// at once during a rolling update): each is an in-process mutex, for this
// agent's goroutines, and an flock on a file in the state directory, for the
// other agent.
//   - A parent's lock orders the changes of that parent's qdiscs, classes
//     and IFB: class numbers are picked from what the kernel shows, and an
//     idle HTB or IFB is removed only while no share is being added. Work on
//     different parents runs in parallel.
//   - The pool lock orders address allocation, which reads every attach
//     spec on disk and writes the share's own.
//   - The probe lock orders the one-off probes of a kind of child
//     interface (checkChild), which both agents make under one name.
// Interfaces, attach specs and classifier entries are the share's own and
// need neither.

// flockFile takes an exclusive flock on path and returns the unlock.
func flockFile(path, what string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the lock of %s: %w", what, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", what, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close() // a lock file: nothing is written to it
	}, nil
}

// parentLocks are the in-process halves of the parents' locks, by ifindex.
type parentLocks struct {
	mu sync.Mutex
	m  map[int]*sync.Mutex
}

func (l *parentLocks) get(ifindex int) *sync.Mutex {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[int]*sync.Mutex{}
	}
	m, ok := l.m[ifindex]
	if !ok {
		m = &sync.Mutex{}
		l.m[ifindex] = m
	}
	return m
}

// lockParent takes parent's lock and returns the unlock. The file is named
// after the ifindex, which a rename does not change.
func (p *NICPreparer) lockParent(parent netlink.Link) (func(), error) {
	m := p.parentLocks.get(parent.Attrs().Index)
	m.Lock()
	unlock, err := flockFile(filepath.Join(p.opts.StateDir, "netdev", ".lock-parent-"+strconv.Itoa(parent.Attrs().Index)),
		"the qdiscs of "+parent.Attrs().Name)
	if err != nil {
		m.Unlock()
		return nil, err
	}
	return func() { unlock(); m.Unlock() }, nil
}

// lockPools takes the node's address-pool lock and returns the unlock.
func (p *NICPreparer) lockPools() (func(), error) {
	p.poolMu.Lock()
	unlock, err := flockFile(filepath.Join(p.opts.StateDir, "netdev", ".lock"), "the node's address pools")
	if err != nil {
		p.poolMu.Unlock()
		return nil, err
	}
	return func() { unlock(); p.poolMu.Unlock() }, nil
}

// reserveAddressesOnDisk marks as used every address that an attach spec on
// the node holds: those another agent handed out are in no memory of this
// one. The caller holds the pool lock, so the specs are complete.
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
