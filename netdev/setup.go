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
	ifbs map[int]netlink.Link
	// shapers are the parents' egress shapers, by the parent's ifindex.
	shapers map[int]netlink.Link
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

// ifb is the parent's IFB, set up with its HTB and redirect.
func (c *setUpCache) ifb(parent int) (netlink.Link, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.ifbs[parent]
	at, checked := c.done[setUpKey("ifb", parent)]
	return l, ok && checked && time.Since(at) < setUpRecheck
}

func (c *setUpCache) setIFB(parent int, ifb netlink.Link) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ifbs == nil {
		c.ifbs = map[int]netlink.Link{}
	}
	if c.done == nil {
		c.done = map[string]time.Time{}
	}
	c.ifbs[parent] = ifb
	c.done[setUpKey("ifb", parent)] = time.Now()
}

func (c *setUpCache) forgetIFB(parent int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.ifbs[parent]; ok {
		suffix := "/" + strconv.Itoa(l.Attrs().Index)
		for k := range c.done {
			if strings.HasSuffix(k, suffix) {
				delete(c.done, k)
			}
		}
		delete(c.ifbs, parent)
	}
	delete(c.done, setUpKey("ifb", parent))
}

// shaper is the parent's egress shaper, set up with its HTB and the
// classifier's redirect.
func (c *setUpCache) shaper(parent int) (netlink.Link, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.shapers[parent]
	at, checked := c.done[setUpKey("egress-shaper", parent)]
	return l, ok && checked && time.Since(at) < setUpRecheck
}

func (c *setUpCache) setShaper(parent int, shaper netlink.Link) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.shapers == nil {
		c.shapers = map[int]netlink.Link{}
	}
	if c.done == nil {
		c.done = map[string]time.Time{}
	}
	c.shapers[parent] = shaper
	c.done[setUpKey("egress-shaper", parent)] = time.Now()
}

func (c *setUpCache) forgetShaper(parent int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.shapers, parent)
	delete(c.done, setUpKey("egress-shaper", parent))
}
