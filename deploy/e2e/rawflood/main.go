// Command rawflood sends raw Ethernet frames with a source MAC of its
// choosing out of an interface, as any pod with CAP_NET_RAW (containerd's
// default) can: the end-to-end tests run it inside a pod to check that a
// share holds whatever source MAC its frames carry.
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
	flag.Parse()
	srcMAC, err1 := net.ParseMAC(*src)
	dstMAC, err2 := net.ParseMAC(*dst)
	if err1 != nil || err2 != nil || net.ParseIP(*srcIP) == nil || net.ParseIP(*dstIP) == nil {
		fmt.Fprintln(os.Stderr, "rawflood: need -src-mac, -dst-mac, -src-ip and -dst-ip")
		os.Exit(2)
	}
	sent, err := nettest.RawFlood(netns.None(), *ifName, srcMAC, dstMAC, net.ParseIP(*srcIP), net.ParseIP(*dstIP), 1400, time.Duration(*seconds)*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rawflood:", err)
		os.Exit(1)
	}
	fmt.Println(sent)
}
