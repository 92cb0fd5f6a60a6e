package nettest

import (
	"encoding/binary"
	"fmt"
	"net"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// RawFlood sends, from ns, raw Ethernet frames out of ifName for d, as a
// pod with CAP_NET_RAW can: IPv4/UDP to dstIP:9 at dstMAC, with srcMAC as
// the frame's source, whatever the interface's own MAC is. size is the
// frame's length; ns closed (netns.None()) means the caller's own. It
// returns the frames sent.
func RawFlood(ns netns.NsHandle, ifName string, srcMAC, dstMAC net.HardwareAddr, srcIP, dstIP net.IP, size int, d time.Duration) (int, error) {
	return RawSend(ns, ifName, UDPFrame(srcMAC, dstMAC, srcIP, dstIP, size), d)
}

// RawSend sends frame out of ifName from ns, again and again for d, and
// returns how many sends the kernel took.
func RawSend(ns netns.NsHandle, ifName string, frame []byte, d time.Duration) (int, error) {
	var sent int
	in := In
	if !ns.IsOpen() {
		in = func(_ netns.NsHandle, fn func() error) error { return fn() }
	}
	err := in(ns, func() error {
		ifi, err := net.InterfaceByName(ifName)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("AF_PACKET socket: %w", err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6}
		copy(to.Addr[:], frame[:6])
		for start := time.Now(); time.Since(start) < d; {
			if err := unix.Sendto(fd, frame, 0, to); err == nil {
				sent++
			}
		}
		return nil
	})
	return sent, err
}

// Tagged is frame with an 802.1Q tag of vid put in after its MACs, as a
// pod can write one into a raw frame.
func Tagged(frame []byte, vid uint16) []byte {
	out := append([]byte{}, frame[:12]...)
	out = binary.BigEndian.AppendUint16(out, unix.ETH_P_8021Q)
	out = binary.BigEndian.AppendUint16(out, vid&0x0fff)
	return append(out, frame[12:]...)
}

// ARPReply is an ARP reply from srcMAC, to dstMAC, claiming that spa is at
// srcMAC (the gratuitous or poisoning kind when spa is not the sender's).
func ARPReply(srcMAC, dstMAC net.HardwareAddr, spa, tpa net.IP) []byte {
	f := make([]byte, 60)
	copy(f[0:6], dstMAC)
	copy(f[6:12], srcMAC)
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_ARP)
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:], 1)             // Ethernet
	binary.BigEndian.PutUint16(a[2:], unix.ETH_P_IP) // IPv4
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], 2) // reply
	copy(a[8:14], srcMAC)
	copy(a[14:18], spa.To4())
	copy(a[18:24], dstMAC)
	copy(a[24:28], tpa.To4())
	return f
}

// UDPFrame is an IPv4/UDP frame of size bytes to dstIP:9.
func UDPFrame(srcMAC, dstMAC net.HardwareAddr, srcIP, dstIP net.IP, size int) []byte {
	f := make([]byte, max(size, 14+20+8))
	copy(f[0:6], dstMAC)
	copy(f[6:12], srcMAC)
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IP)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(len(f)-14))
	ip[8], ip[9] = 64, unix.IPPROTO_UDP
	copy(ip[12:16], srcIP.To4())
	copy(ip[16:20], dstIP.To4())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := f[34:42]
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], 9)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(f)-34)) // checksum 0: none
	return f
}

// RxBytes is what ifName in ns has received so far.
func RxBytes(ns netns.NsHandle, ifName string) (uint64, error) {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	l, err := h.LinkByName(ifName)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Statistics.RxBytes, nil
}
