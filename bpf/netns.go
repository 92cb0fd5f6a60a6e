package bpf

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// PodShare is one pod's share of one parent for egress: frames its sockets
// send out of the parent are the share's, whatever their source MAC.
type PodShare struct {
	// NetnsCookie is the pod's network namespace (SO_NETNS_COOKIE).
	NetnsCookie uint64
	// Parent is the parent's ifindex in the node's namespace.
	Parent int
	// MAC names the share (its counters and its MAC-keyed entries).
	MAC string
	// ClassID is the share's HTB class; 0 for a share with no egress
	// limit, whose frames are then never charged to another share.
	ClassID uint32
	// VLAN is the share's VLAN on its parent (0: none): the only tag its
	// frames may carry.
	VLAN int
	// AllowMACChange lets the pod send from other MACs (learned for its
	// ingress); otherwise a frame from another MAC is dropped.
	AllowMACChange bool
	// CheckIPv4 drops IPv4 sources and ARP senders outside the share's
	// addresses (AllowAddr); CheckIPv6 IPv6 sources and ND advertisement
	// targets. Each is set where the share has addresses of the family,
	// or none and its class leaves the family closed (openFamilies).
	CheckIPv4, CheckIPv6 bool
	// AllowRouterAdvertisements lets the pod send IPv6 router
	// advertisements and redirects (a pod that routes for its segment).
	AllowRouterAdvertisements bool
}

// vlanFlags packs VLAN and the flags as netns_val.vlan_flags has them.
func (p PodShare) vlanFlags() (uint16, error) {
	if p.VLAN < 0 || p.VLAN > 4094 {
		return 0, fmt.Errorf("VLAN %d is not 0-4094", p.VLAN)
	}
	v := uint16(p.VLAN)
	if p.AllowMACChange {
		v |= netnsAllowMACChange << netnsFlagsShift
	}
	if p.CheckIPv4 {
		v |= netnsCheckIPv4 << netnsFlagsShift
	}
	if p.CheckIPv6 {
		v |= netnsCheckIPv6 << netnsFlagsShift
	}
	if p.AllowRouterAdvertisements {
		v |= netnsAllowRouter << netnsFlagsShift
	}
	return v, nil
}

// NETNS_* in shaper.c.
const (
	netnsAllowMACChange = 1
	netnsCheckIPv4      = 2
	netnsCheckIPv6      = 4
	netnsAllowRouter    = 8
	netnsFlagsShift     = 12
)

// NetnsMap is the pinned pod-netns map alone, for the runtime hook, which
// records a pod's namespace once the pod exists without loading programs.
type NetnsMap struct{ m *ebpf.Map }

// OpenNetnsMap opens the map the agent pinned under pinDir.
func OpenNetnsMap(pinDir string) (*NetnsMap, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, shaperMapShareNetns), nil)
	if err != nil {
		return nil, fmt.Errorf("open the classifier's pod map under %s: %w", pinDir, err)
	}
	return &NetnsMap{m: m}, nil
}

// Close releases the map; its pin and entries stay.
func (n *NetnsMap) Close() error { return n.m.Close() }

// ErrNetnsTaken is returned when the pod's namespace already holds another
// share of the same parent: the classifier could not tell their frames
// apart.
var ErrNetnsTaken = errors.New("the pod already holds another share of this parent")

// Set records s; recording the same share again is a no-op.
func (n *NetnsMap) Set(s PodShare) error { return setPodShare(n.m, s) }

func podKey(cookie uint64, parent int) (shaperNetnsKey, error) {
	if cookie == 0 || parent <= 0 {
		return shaperNetnsKey{}, fmt.Errorf("bad pod share key: netns cookie %d, parent ifindex %d", cookie, parent)
	}
	return shaperNetnsKey{Cookie: cookie, Ifindex: uint32(parent)}, nil
}

func setPodShare(m *ebpf.Map, s PodShare) error {
	k, err := podKey(s.NetnsCookie, s.Parent)
	if err != nil {
		return err
	}
	mac, err := net.ParseMAC(s.MAC)
	if err != nil || len(mac) != 6 {
		return fmt.Errorf("pod share MAC %q: %v", s.MAC, err)
	}
	vf, err := s.vlanFlags()
	if err != nil {
		return err
	}
	v := shaperNetnsVal{Classid: s.ClassID, VlanFlags: vf}
	copy(v.Mac[:], mac)
	var old shaperNetnsVal
	if err := m.Lookup(&k, &old); err == nil && old.Mac != v.Mac {
		return fmt.Errorf("%w (%s, not %s)", ErrNetnsTaken, net.HardwareAddr(old.Mac[:]), mac)
	}
	// NOEXIST first: two hooks of one pod racing both succeed, and a
	// share of the same pod on another parent is another key. The first
	// hook of a sandbox (its entry new) drops the entries its share's
	// earlier sandboxes left; the pod's later containers find it there.
	err = m.Update(&k, &v, ebpf.UpdateNoExist)
	if err == nil {
		return dropOtherSandboxes(m, k, v.Mac)
	}
	if !errors.Is(err, ebpf.ErrKeyExist) {
		return err
	}
	if err := m.Lookup(&k, &old); err == nil && old.Mac != v.Mac {
		return fmt.Errorf("%w (%s, not %s)", ErrNetnsTaken, net.HardwareAddr(old.Mac[:]), mac)
	}
	return m.Update(&k, &v, ebpf.UpdateExist)
}

// dropOtherSandboxes deletes the entries of the share named by mac on k's
// parent in any other namespace than k's: a pod sandbox the runtime
// re-created (its hook records the new one) leaves its old namespace's
// entry behind, and the node-wide map would fill with them.
func dropOtherSandboxes(m *ebpf.Map, k shaperNetnsKey, mac [6]byte) error {
	var stale []shaperNetnsKey
	var ik shaperNetnsKey
	var iv shaperNetnsVal
	it := m.Iterate()
	for it.Next(&ik, &iv) {
		if iv.Mac == mac && ik.Ifindex == k.Ifindex && ik.Cookie != k.Cookie {
			stale = append(stale, ik)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list the pod entries: %w", err)
	}
	for _, sk := range stale {
		if err := m.Delete(&sk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete the entry of a pod sandbox since re-created: %w", err)
		}
	}
	return nil
}

// PodShares lists every recorded pod share.
func (s *Shaper) PodShares() ([]PodShare, error) {
	var out []PodShare
	var k shaperNetnsKey
	var v shaperNetnsVal
	it := s.objs.ShareNetns.Iterate()
	for it.Next(&k, &v) {
		flags := v.VlanFlags >> netnsFlagsShift
		out = append(out, PodShare{NetnsCookie: k.Cookie, Parent: int(k.Ifindex), MAC: net.HardwareAddr(v.Mac[:]).String(), ClassID: v.Classid,
			VLAN: int(v.VlanFlags & 0x0fff), AllowMACChange: flags&netnsAllowMACChange != 0, CheckIPv4: flags&netnsCheckIPv4 != 0, CheckIPv6: flags&netnsCheckIPv6 != 0,
			AllowRouterAdvertisements: flags&netnsAllowRouter != 0})
	}
	return out, it.Err()
}

// SetPodShare records s (see NetnsMap.Set).
func (s *Shaper) SetPodShare(p PodShare) error { return setPodShare(s.objs.ShareNetns, p) }

// DeletePodShares removes every pod entry of the share named by mac, in
// whatever pod namespace the hook recorded it: unprepare needs nothing but
// the share's MAC, even after a crash. Deleting none is not an error.
func (s *Shaper) DeletePodShares(mac net.HardwareAddr) error {
	all, err := s.PodShares()
	if err != nil {
		return err
	}
	for _, p := range all {
		if p.MAC != mac.String() {
			continue
		}
		k, _ := podKey(p.NetnsCookie, p.Parent)
		if err := s.objs.ShareNetns.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete the pod entry of share %s: %w", mac, err)
		}
	}
	// What the pod side of the share holds besides: the addresses and
	// ethertypes it may send and its drop counts.
	return errors.Join(deleteAddrsOf(s.objs.AllowedAddrs, mac), s.deleteEthertypes(mac), s.forgetSpoofDrops(mac))
}

// NetnsCookie returns the cookie of the network namespace the calling
// thread is in, as bpf_get_netns_cookie sees it for sockets made there.
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return 0, fmt.Errorf("socket for the netns cookie: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("SO_NETNS_COOKIE: %w", err)
	}
	return c, nil
}
