package netdev

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// linkMinor is the link class of a device's HTB (ceiling.go): held to the
// NIC's capacity in its direction, every share class of the device hangs
// from it and borrows from it. Devices an older carve made have none, and
// their share classes hang from the HTB itself: their shares keep their
// hard caps, and a share that would borrow is refused there until the
// device's shares are all gone and it is made again.
const linkMinor = 1

var linkHandle = netlink.MakeHandle(1, linkMinor)

// addLinkClass gives link's new HTB its link class of rateBits.
func addLinkClass(h *netlink.Handle, link netlink.Link, rateBits uint64) error {
	buf := htbBuffer(rateBits)
	class := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: link.Attrs().Index, Parent: rootHandle, Handle: linkHandle},
		netlink.HtbClassAttrs{Rate: rateBits, Ceil: rateBits, Buffer: buf, Cbuffer: buf, Quantum: quantum(rateBits)})
	err := h.ClassAdd(class)
	if errors.Is(err, unix.EEXIST) {
		err = h.ClassChange(class)
	}
	if err != nil {
		return fmt.Errorf("link class 1:%x of %d bit/s on %s: %w", linkMinor, rateBits, link.Attrs().Name, err)
	}
	return nil
}

// shareParent is the class the share classes of dev hang from: its link
// class where it has one, else its HTB. The kernel is asked once per
// device while it is set up (one class, not a dump).
func (p *NICPreparer) shareParent(dev netlink.Link) (uint32, error) {
	idx := dev.Attrs().Index
	switch {
	case p.setUp.has("link-class", idx):
		return linkHandle, nil
	case p.setUp.has("no-link-class", idx):
		return rootHandle, nil
	}
	st, err := p.classStates(idx, []uint32{linkHandle})
	if err != nil {
		return 0, err
	}
	if st[0].exists {
		p.setUp.add("link-class", idx)
		return linkHandle, nil
	}
	p.setUp.add("no-link-class", idx)
	return rootHandle, nil
}

// errNoLinkClass refuses a borrowing share on a device an older carve made.
var errNoLinkClass = errors.New("its classes were made by an older carve, with no link class to borrow from: " +
	"a share may borrow there once the NIC's shares are all gone and carve makes its classes again")
