package netdev

import (
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

// allocate returns key's address from pool, the same one if key already
// holds one there.
func (m *ipam) allocate(pool nodeconfig.AddressPool, key string) (netip.Prefix, error) {
	prefix, err := netip.ParsePrefix(pool.CIDR)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("pool %s: %w", pool.Name, err)
	}
	prefix = prefix.Masked()
	var gw netip.Addr
	if pool.Gateway != "" {
		gw, _ = netip.ParseAddr(pool.Gateway)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for a, k := range m.inUse {
		if k == key && prefix.Contains(a) {
			return netip.PrefixFrom(a, prefix.Bits()), nil
		}
	}
	last := lastAddr(prefix)
	for a := prefix.Addr().Next(); a.IsValid() && prefix.Contains(a); a = a.Next() {
		if a == gw || (a.Is4() && a == last) {
			continue
		}
		if _, used := m.inUse[a]; !used {
			m.inUse[a] = key
			return netip.PrefixFrom(a, prefix.Bits()), nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("address pool %s (%s) is exhausted: %d addresses in use", pool.Name, pool.CIDR, m.countIn(prefix))
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
