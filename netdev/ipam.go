package netdev

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"sync"

	"github.com/carve-dra/carve/slices/nodeconfig"
)

// ipam hands out one address per share from the node's pools. What is in use
// lives in the shares' undo records in the checkpoint; the agent restores it
// from there at start, and keeps it here in memory while it runs.
type ipam struct {
	mu    sync.Mutex
	inUse map[netip.Addr]string // address -> share key
}

func newIPAM() *ipam { return &ipam{inUse: map[netip.Addr]string{}} }

// errPoolExhausted is pick's error where the pool has no address left to
// try.
var errPoolExhausted = errors.New("is exhausted")

// pick marks and returns key's candidate in pool: the address key holds
// there already (held true: a prepare again), else the first free one that
// is neither skipped (held elsewhere) nor tried. A candidate of a
// cluster-wide pool is the share's once the API server records it so
// (allocateFromPools); until then it is marked key's here, so that no other
// share of this agent takes it meanwhile.
func (m *ipam) pick(pool nodeconfig.AddressPool, key string, skip, tried map[netip.Addr]bool) (netip.Prefix, bool, error) {
	prefix, err := netip.ParsePrefix(pool.CIDR)
	if err != nil {
		return netip.Prefix{}, false, fmt.Errorf("pool %s: %w", pool.Name, err)
	}
	prefix = prefix.Masked()
	var gw netip.Addr
	if pool.Gateway != "" {
		gw, _ = netip.ParseAddr(pool.Gateway)
	}
	a, held, ok := m.candidate(prefix, gw, key, skip, tried)
	if !ok {
		return netip.Prefix{}, false, fmt.Errorf("address pool %s (%s) %w: %d addresses in use on this node, %d held by other nodes' shares, %d taken while trying",
			pool.Name, pool.CIDR, errPoolExhausted, m.countIn(prefix), len(skip), len(tried))
	}
	return netip.PrefixFrom(a, prefix.Bits()), held, nil
}

// drop unmarks a candidate pick gave key (not one key held before).
func (m *ipam) drop(a netip.Addr, key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.inUse[a] == key {
		delete(m.inUse, a)
	}
}

// candidate marks and returns the address key holds in prefix (held true),
// else the first free one that is neither skipped nor tried.
func (m *ipam) candidate(prefix netip.Prefix, gw netip.Addr, key string, skip, tried map[netip.Addr]bool) (netip.Addr, bool, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for a, k := range m.inUse {
		if k == key && prefix.Contains(a) {
			return a, true, true
		}
	}
	last := lastAddr(prefix)
	for a := prefix.Addr().Next(); a.IsValid() && prefix.Contains(a); a = a.Next() {
		if a == gw || (a.Is4() && a == last) || skip[a] || tried[a] {
			continue
		}
		if _, used := m.inUse[a]; !used {
			m.inUse[a] = key
			return a, false, true
		}
	}
	return netip.Addr{}, false, false
}

func (m *ipam) countIn(p netip.Prefix) int {
	n := 0
	for a := range m.inUse {
		if p.Contains(a) {
			n++
		}
	}
	return n
}

// reserve marks addresses as used by key (restoring from records).
func (m *ipam) reserve(key string, addrs []netip.Prefix) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range addrs {
		m.inUse[a.Addr()] = key
	}
}

// reserveFree marks addresses as used by key where no share holds them yet
// here (what another agent on the node handed out).
func (m *ipam) reserveFree(key string, addrs []netip.Prefix) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range addrs {
		if _, used := m.inUse[a.Addr()]; !used {
			m.inUse[a.Addr()] = key
		}
	}
}

// addrsOf lists the addresses key holds.
func (m *ipam) addrsOf(key string) []netip.Addr {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []netip.Addr
	for a, k := range m.inUse {
		if k == key {
			out = append(out, a)
		}
	}
	return out
}

// release frees every address key holds.
func (m *ipam) release(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	maps.DeleteFunc(m.inUse, func(_ netip.Addr, k string) bool { return k == key })
}

// lastAddr is the prefix's broadcast address (for IPv4).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	bits := p.Bits()
	for i := range b {
		for j := 0; j < 8; j++ {
			if i*8+j >= bits {
				b[i] |= 0x80 >> j
			}
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
