package netdev

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
)

// setUpCache remembers what carve has set up on a device (its HTB root, a
// parent's IFB with its redirect) so that a steady-state prepare does not
// list qdiscs and filters again. It is read and changed under the device's
// parent lock; an entry is forgotten when the reaper removes the object,
// and when a prepare that relied on it fails (the next one looks again).
type setUpCache struct {
	mu   sync.Mutex
	done map[string]time.Time
	// companions are the parents' IFBs and egress shapers, by role and
	// the parent's ifindex.
	companions map[string]map[int]netlink.Link
}

// setUpRecheck bounds how long a device's set-up is taken on trust: an
// operator's tc or bpftool that removes carve's classifier or qdisc is
// repaired by the next prepare after it at most this much later (and
// `carve shares` reports the share as not enforced meanwhile).
const setUpRecheck = 30 * time.Second

func setUpKey(what string, ifindex int) string { return what + "/" + strconv.Itoa(ifindex) }

func (c *setUpCache) has(what string, ifindex int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.done[setUpKey(what, ifindex)]
	return ok && time.Since(at) < setUpRecheck
}

func (c *setUpCache) add(what string, ifindex int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = map[string]time.Time{}
	}
	c.done[setUpKey(what, ifindex)] = time.Now()
}

func (c *setUpCache) forget(what string, ifindex int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.done, setUpKey(what, ifindex))
}

// forgetDevice forgets everything set up on a device.
func (c *setUpCache) forgetDevice(ifindex int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	suffix := "/" + strconv.Itoa(ifindex)
	for k := range c.done {
		if strings.HasSuffix(k, suffix) {
			delete(c.done, k)
		}
	}
}

// A parent's companion devices, set up with their HTB and redirect: the
// ingress IFB and the egress shaper.
const (
	companionIFB          = "ifb"
	companionEgressShaper = "egress-shaper"
)

// companion is a parent's companion device of a role, while its set-up is
// taken on trust.
func (c *setUpCache) companion(role string, parent int) (netlink.Link, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.companions[role][parent]
	at, checked := c.done[setUpKey(role, parent)]
	return l, ok && checked && time.Since(at) < setUpRecheck
}

func (c *setUpCache) setCompanion(role string, parent int, l netlink.Link) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.companions == nil {
		c.companions = map[string]map[int]netlink.Link{}
	}
	if c.companions[role] == nil {
		c.companions[role] = map[int]netlink.Link{}
	}
	if c.done == nil {
		c.done = map[string]time.Time{}
	}
	c.companions[role][parent] = l
	c.done[setUpKey(role, parent)] = time.Now()
}

// forgetCompanion forgets a parent's companion and what was set up on it.
func (c *setUpCache) forgetCompanion(role string, parent int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.companions[role][parent]; ok {
		suffix := "/" + strconv.Itoa(l.Attrs().Index)
		for k := range c.done {
			if strings.HasSuffix(k, suffix) {
				delete(c.done, k)
			}
		}
		delete(c.companions[role], parent)
	}
	delete(c.done, setUpKey(role, parent))
}
