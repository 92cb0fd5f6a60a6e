package netdev

import (
	"strconv"
	"sync"

	"github.com/vishvananda/netlink"
)

// setUpCache remembers what carve has set up on a device (its HTB root, a
// parent's IFB with its redirect) so that a steady-state prepare does not
// list qdiscs and filters again. It is read and changed under the device's
// parent lock; an entry is forgotten when the reaper removes the object,
// and when a prepare that relied on it fails (the next one looks again).
type setUpCache struct {
	mu   sync.Mutex
	done map[string]bool
	ifbs map[int]netlink.Link
}

func setUpKey(what string, ifindex int) string { return what + "/" + strconv.Itoa(ifindex) }

func (c *setUpCache) has(what string, ifindex int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done[setUpKey(what, ifindex)]
}

func (c *setUpCache) add(what string, ifindex int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = map[string]bool{}
	}
	c.done[setUpKey(what, ifindex)] = true
}

func (c *setUpCache) forget(what string, ifindex int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.done, setUpKey(what, ifindex))
}

// ifb is the parent's IFB, set up with its HTB and redirect.
func (c *setUpCache) ifb(parent int) (netlink.Link, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.ifbs[parent]
	return l, ok
}

func (c *setUpCache) setIFB(parent int, ifb netlink.Link) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ifbs == nil {
		c.ifbs = map[int]netlink.Link{}
	}
	c.ifbs[parent] = ifb
}

func (c *setUpCache) forgetIFB(parent int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.ifbs[parent]; ok {
		delete(c.done, setUpKey("htb", l.Attrs().Index))
		delete(c.ifbs, parent)
	}
}
