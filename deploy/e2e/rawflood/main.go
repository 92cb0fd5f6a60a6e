// Command rawflood sends raw Ethernet frames with a source MAC, source IP,
// VLAN tag or ARP claim of its choosing out of an interface, as any pod
// with CAP_NET_RAW (containerd's default) can: the end-to-end tests run it
// inside a pod to check that a share's classifier drops every frame that
// claims another's identity.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf/nettest"
)

func main() {
	ifName := flag.String("if", "net1", "interface to send from")
	src := flag.String("src-mac", "02:ba:d0:00:00:01", "source MAC to forge")
	dst := flag.String("dst-mac", "", "destination MAC (the server's)")
	srcIP := flag.String("src-ip", "", "source IPv4")
	dstIP := flag.String("dst-ip", "", "destination IPv4 (UDP port 9)")
	seconds := flag.Int("seconds", 3, "how long to send")
	vlan := flag.Int("vlan", 0, "put this 802.1Q tag in the frames (0: none)")
	arp := flag.String("arp-claim", "", "send ARP replies claiming this IPv4 address is at -src-mac, instead of UDP")
	flag.Parse()
	srcMAC, err1 := net.ParseMAC(*src)
	dstMAC, err2 := net.ParseMAC(*dst)
	if err1 != nil || err2 != nil || net.ParseIP(*srcIP) == nil || net.ParseIP(*dstIP) == nil {
		fmt.Fprintln(os.Stderr, "rawflood: need -src-mac, -dst-mac, -src-ip and -dst-ip")
		os.Exit(2)
	}
	frame := nettest.UDPFrame(srcMAC, dstMAC, net.ParseIP(*srcIP), net.ParseIP(*dstIP), 1400)
	if *arp != "" {
		if net.ParseIP(*arp).To4() == nil {
			fmt.Fprintln(os.Stderr, "rawflood: -arp-claim needs an IPv4 address")
			os.Exit(2)
		}
		frame = nettest.ARPReply(srcMAC, dstMAC, net.ParseIP(*arp), net.ParseIP(*dstIP))
	}
	if *vlan != 0 {
		frame = nettest.Tagged(frame, uint16(*vlan))
	}
	sent, err := nettest.RawSend(netns.None(), *ifName, frame, time.Duration(*seconds)*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rawflood:", err)
		os.Exit(1)
	}
	fmt.Println(sent)
}
