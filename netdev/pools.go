package netdev

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/netdev/addrbook"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/hook"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// allocateFromPools gives the share one address from each pool. A
// candidate is picked under the pools' lock and written to the share's
// attach spec before the lock is let go: the spec is how another agent on
// the node sees it taken. An address of a cluster-wide pool (scope Cluster,
// the default) is the share's only once the API server records it so
// (package addrbook): other nodes hand out the same subnet. Those records,
// and the list of what other nodes hold, are asked for outside the lock:
// held across them, the lock made every share of a burst wait for each
// earlier one's round trips in turn (100 share pods at once: 8.2 s a
// prepare on average, 34 of them queued on the lock at one moment). The
// record's name is the address, so two shares that pick one address at
// once, on this node or another, get one record: the other tries the next.
func (p *NICPreparer) allocateFromPools(ctx context.Context, pools []string, a prepare.Allocation, spec hook.AttachSpec, specPath string, u *undoRecord) error {
	key := a.ShareKey()
	tries := make([]*poolTry, 0, len(pools))
	for _, name := range pools {
		pool, ok := p.opts.Config.Pool(name)
		if !ok {
			return fmt.Errorf("address pool %q is not in the node config", name)
		}
		t := &poolTry{pool: pool, tried: map[netip.Addr]bool{}}
		if pool.ClusterWide() {
			if p.opts.Addresses == nil {
				return fmt.Errorf("address pool %q is cluster-wide (its scope is not Node), and this agent has no API server to record its addresses in", name)
			}
			skip, cached, err := p.heldElsewhere(ctx, pool.Name, key, false)
			if err != nil {
				return err
			}
			h := addrbook.Holder{Node: p.opts.Addresses.Node(), Share: key, ClaimNamespace: a.ClaimNamespace, ClaimName: a.ClaimName, ClaimUID: a.ClaimUID}
			t.skip, t.cachedSkip = skip, cached
			t.hold = func(addr netip.Addr) (bool, error) { return p.opts.Addresses.Hold(ctx, pool.Name, addr, h) }
		}
		tries = append(tries, t)
	}
	static := u.Addresses
	pending := tries
	for len(pending) > 0 {
		if err := p.pickCandidates(pending, tries, key, static, spec, specPath); err != nil {
			if errors.Is(err, errPoolExhausted) {
				// The watched records may still name an address
				// released since: ask the API server before giving up.
				refreshed, rerr := p.refreshSkips(ctx, pending, key)
				if rerr != nil {
					err = errors.Join(err, rerr)
				} else if refreshed {
					p.dropCandidates(pending, key)
					for _, t := range pending {
						t.addr = netip.Prefix{}
					}
					continue
				}
			}
			p.dropCandidates(tries, key)
			return err
		}
		var again []*poolTry
		for _, t := range pending {
			if t.hold == nil {
				continue
			}
			mine, err := t.hold(t.addr.Addr())
			switch {
			case err != nil:
				p.dropCandidates(tries, key)
				return err
			case mine:
				continue
			case t.held:
				// Its record is another share's now: the pool's
				// records are the truth.
				p.dropCandidates(tries, key)
				return fmt.Errorf("address %s of pool %s, which this share held, is recorded as another share's", t.addr.Addr(), t.pool.Name)
			}
			p.ipam.drop(t.addr.Addr(), key)
			t.tried[t.addr.Addr()] = true
			again = append(again, t)
		}
		pending = again
	}
	for _, t := range tries {
		u.PoolAddrs = append(u.PoolAddrs, t.addr.String())
		u.Addresses = append(u.Addresses, t.addr.String())
	}
	return nil
}

// poolTry is one pool's part of allocateFromPools: its candidate and what
// was tried.
type poolTry struct {
	pool nodeconfig.AddressPool
	skip map[netip.Addr]bool // held by other nodes' shares
	// cachedSkip: skip is from the watched records, not yet a List.
	cachedSkip bool
	tried      map[netip.Addr]bool // recorded as another share's when tried
	hold       func(netip.Addr) (bool, error)
	addr       netip.Prefix // the candidate
	held       bool         // the share held it before this prepare
}

// pickCandidates picks a candidate in each pending pool under the pools'
// lock and writes the share's attach spec with every pool's candidate (after
// its static addresses) before letting the lock go.
func (p *NICPreparer) pickCandidates(pending, all []*poolTry, key string, static []string, spec hook.AttachSpec, specPath string) error {
	unlock, err := p.lockPools()
	if err != nil {
		return err
	}
	defer unlock()
	if err := p.reserveAddressesOnDisk(); err != nil {
		return err
	}
	for _, t := range pending {
		// The share's own spec still names a candidate refused since:
		// it is not the share's.
		for a := range t.tried {
			p.ipam.drop(a, key)
		}
		if t.addr, t.held, err = p.ipam.pick(t.pool, key, t.skip, t.tried); err != nil {
			return err
		}
	}
	spec.Addresses = append([]string(nil), static...)
	for _, t := range all {
		spec.Addresses = append(spec.Addresses, t.addr.String())
	}
	return hook.WriteAttachSpec(specPath, spec)
}

// dropCandidates unmarks the candidates of a failed allocation that the
// share did not hold before.
func (p *NICPreparer) dropCandidates(tries []*poolTry, key string) {
	for _, t := range tries {
		if t.addr.IsValid() && !t.held {
			p.ipam.drop(t.addr.Addr(), key)
		}
	}
}

// heldElsewhere is the pool's addresses recorded as another share's, read
// before the candidates are tried, so that the shares of many nodes
// preparing at once do not all try the first free address: from the
// watched records where the book has them (cached), else, or where now
// says so, from a List.
func (p *NICPreparer) heldElsewhere(ctx context.Context, pool, key string, now bool) (skip map[netip.Addr]bool, cached bool, err error) {
	var held map[netip.Addr]string
	if now {
		held, err = p.opts.Addresses.HeldNow(ctx, pool)
	} else {
		held, cached, err = p.opts.Addresses.Held(ctx, pool)
	}
	if err != nil {
		return nil, false, err
	}
	mine := p.opts.Addresses.Node() + "/" + key
	skip = make(map[netip.Addr]bool, len(held))
	for a, holder := range held {
		if holder != mine {
			skip[a] = true
		}
	}
	return skip, cached, nil
}

// refreshSkips reads again from a List what other shares hold of each
// pending pool whose skip came from the watched records, and says whether
// there was one.
func (p *NICPreparer) refreshSkips(ctx context.Context, pending []*poolTry, key string) (bool, error) {
	refreshed := false
	for _, t := range pending {
		if !t.cachedSkip {
			continue
		}
		skip, _, err := p.heldElsewhere(ctx, t.pool.Name, key, true)
		if err != nil {
			return false, err
		}
		t.skip, t.cachedSkip, refreshed = skip, false, true
	}
	return refreshed, nil
}

// releasePoolAddrs deletes the records of the share's addresses of
// cluster-wide pools: those its undo record names, and those this agent
// handed it (an unprepare without a record). It runs first in unprepare:
// where the API server cannot be reached, unprepare fails with nothing
// undone, and the kubelet tries it again.
func (p *NICPreparer) releasePoolAddrs(ctx context.Context, key string, recorded []string) error {
	if p.opts.Addresses == nil || p.opts.Config == nil {
		return nil
	}
	addrs := map[netip.Addr]bool{}
	for _, a := range p.ipam.addrsOf(key) {
		addrs[a] = true
	}
	for _, s := range recorded {
		if pfx, err := netip.ParsePrefix(s); err == nil {
			addrs[pfx.Addr()] = true
		}
	}
	var errs []error
	for a := range addrs {
		for _, pool := range p.opts.Config.Netdev.Pools {
			if pool.ClusterWide() && poolContains(pool, a) {
				errs = append(errs, p.opts.Addresses.Release(ctx, pool.Name, a, key))
			}
		}
	}
	return errors.Join(errs...)
}

// recordRestored records, at the agent's start, the addresses of
// cluster-wide pools that a share prepared before holds: an older carve
// kept its pools to the node and recorded none, and a record may have been
// swept while this node was down. An address another share now holds is
// logged: two pods have it, and the admin must move one.
func (p *NICPreparer) recordRestored(ctx context.Context, a prepare.Allocation, addrs []netip.Prefix) {
	if p.opts.Addresses == nil || p.opts.Config == nil {
		return
	}
	logger := klog.FromContext(ctx)
	h := addrbook.Holder{Node: p.opts.Addresses.Node(), Share: a.ShareKey(), ClaimNamespace: a.ClaimNamespace, ClaimName: a.ClaimName, ClaimUID: a.ClaimUID}
	for _, pfx := range addrs {
		for _, pool := range p.opts.Config.Netdev.Pools {
			if !pool.ClusterWide() || !poolContains(pool, pfx.Addr()) {
				continue
			}
			mine, err := p.opts.Addresses.Hold(ctx, pool.Name, pfx.Addr(), h)
			switch {
			case err != nil:
				logger.Error(err, "Recording a restored share's pool address", "pool", pool.Name, "address", pfx.Addr(), "claim", a.ClaimNamespace+"/"+a.ClaimName)
			case !mine:
				logger.Error(nil, "A restored share's pool address is recorded as another share's: two pods have it", "pool", pool.Name,
					"address", pfx.Addr(), "claim", a.ClaimNamespace+"/"+a.ClaimName)
			}
		}
	}
}

func poolContains(pool nodeconfig.AddressPool, a netip.Addr) bool {
	prefix, err := netip.ParsePrefix(pool.CIDR)
	return err == nil && prefix.Masked().Contains(a)
}
