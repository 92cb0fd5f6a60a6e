package netdev

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// linkRef is the link named name in the preparer's namespace as far as a
// tc request needs it: its index and name, from one ioctl on the
// preparer's socket of that namespace (SIOCGIFINDEX, which any socket
// answers for its own namespace). LinkByName has the kernel describe the
// whole link, statistics and all, and the library parse it: three of them
// were a fifth of an unprepare's CPU. Not for what needs the link's other
// attributes (its MTU, flags, type).
func (p *NICPreparer) linkRef(name string) (netlink.Link, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return nil, fmt.Errorf("link %q: %w", name, err)
	}
	if err := unix.IoctlIfreq(p.route.Socket.GetFd(), unix.SIOCGIFINDEX, ifr); err != nil {
		return nil, fmt.Errorf("link %q: %w", name, err)
	}
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: int(ifr.Uint32()), Name: name}}, nil
}
