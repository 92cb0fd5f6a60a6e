package netdev_test

import (
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// A family in which carve gave a share no address is closed unless the
// share's DeviceClass opens it (openFamilies): a pod with CAP_NET_ADMIN
// that puts an address of its own choosing on its interface reaches no one
// through it, IPv4 or IPv6, with a socket of its own or through its
// kernel's ARP and neighbour discovery. Opened, the same pod connects (the
// address came from the segment: DHCP, SLAAC). Families the share has
// addresses in are checked either way.
func TestClosedFamilies(t *testing.T) {
	const podV4, podV6, srvV6 = "10.77.0.251/24", "fd77::5/64", "fd77::1/64"
	open := []string{v1alpha1.FamilyIPv4, v1alpha1.FamilyIPv6}
	for _, c := range []struct {
		name    string
		cfg     *v1alpha1.NetworkConfig
		podAddr string // what the pod adds to its interface
		connect bool   // whether it may then reach the server from it
	}{
		{"no address, IPv4 closed", &v1alpha1.NetworkConfig{}, podV4, false},
		{"IPv4 pool only, IPv6 closed", nil, podV6, false},
		{"no address, IPv4 opened", &v1alpha1.NetworkConfig{OpenFamilies: open}, podV4, true},
		{"IPv4 pool only, IPv6 opened", &v1alpha1.NetworkConfig{Pools: []string{"test"}, OpenFamilies: open}, podV6, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBench(t)
			a := b.add("family", "20M", "20M", c.cfg)
			srv, err := netlink.NewHandleAt(b.tp.Server)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			peer, err := srv.LinkByName("peer0")
			if err != nil {
				t.Fatal(err)
			}
			addNoDAD(t, srv, peer, srvV6)
			pod, err := netlink.NewHandleAt(a.pod)
			if err != nil {
				t.Fatal(err)
			}
			defer pod.Close()
			net1, err := pod.LinkByName("net1")
			if err != nil {
				t.Fatal(err)
			}
			addNoDAD(t, pod, net1, c.podAddr)
			server := net.JoinHostPort(b.tp.ServerIP, "7101")
			if ip, _, _ := net.ParseCIDR(c.podAddr); ip.To4() == nil {
				server = "[fd77::1]:7101"
			}
			l, err := nettest.Listen(b.tp.Server, server)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			go func() {
				for {
					conn, err := l.Accept()
					if err != nil {
						return
					}
					_ = conn.Close()
				}
			}()
			before, _ := b.shaper.SpoofDrops()
			var conn net.Conn
			err = nettest.In(a.pod, func() error {
				d := net.Dialer{Timeout: 3 * time.Second}
				var err error
				conn, err = d.Dial("tcp", server)
				return err
			})
			if conn != nil {
				_ = conn.Close()
			}
			after, _ := b.shaper.SpoofDrops()
			dropped := after[a.mac][bpf.SpoofSrcIP] + after[a.mac][bpf.SpoofARP] - before[a.mac][bpf.SpoofSrcIP] - before[a.mac][bpf.SpoofARP]
			t.Logf("from %s: connect %v; %d frames dropped as the share's source-ip or arp", c.podAddr, err, dropped)
			switch {
			case c.connect && err != nil:
				t.Errorf("from %s in an opened family: %v, want connected", c.podAddr, err)
			case !c.connect && err == nil:
				t.Errorf("from %s in a closed family: connected", c.podAddr)
			case !c.connect && dropped == 0:
				t.Errorf("from %s in a closed family: no frame counted as dropped under the share", c.podAddr)
			}
			if a.ip != "" {
				// Its own address passes whatever its class opens.
				own := net.JoinHostPort(b.tp.ServerIP, "7102")
				l4, err := nettest.Listen(b.tp.Server, own)
				if err != nil {
					t.Fatal(err)
				}
				defer l4.Close()
				conn, err := nettest.Dial(a.pod, own)
				if err != nil {
					t.Errorf("from its own address %s: %v", a.ip, err)
				} else {
					_ = conn.Close()
				}
			}
		})
	}
}

// addNoDAD adds addr to link through h, without duplicate address
// detection (an IPv6 address is then usable at once).
func addNoDAD(t *testing.T, h *netlink.Handle, link netlink.Link, addr string) {
	t.Helper()
	a, err := netlink.ParseAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	a.Flags = unix.IFA_F_NODAD
	if err := h.AddrAdd(link, a); err != nil {
		t.Fatalf("add %s to %s: %v", addr, link.Attrs().Name, err)
	}
}
