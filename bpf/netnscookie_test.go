package bpf

import (
	"fmt"
	"net"
	"testing"
)

// The classifier finds a pod's frames by the netns cookie of the sending
// socket both ways it can read it: with bpf_get_netns_cookie where tc
// programs have it (Linux 6.15 on), and from the socket's namespace through
// CO-RE before (the only way on 6.1 and 6.12: make vmtest). A frame from this
// test's namespace is the recorded pod's, so a forged source MAC is dropped;
// the same frame from another namespace is no pod's, and passes.
func TestNetnsCookieBothWays(t *testing.T) {
	needRoot(t)
	for _, viaSocket := range []bool{false, true} {
		t.Run(fmt.Sprintf("read through the socket %v", viaSocket), func(t *testing.T) {
			forceSocketNetnsCookie = viaSocket
			defer func() { forceSocketNetnsCookie = false }()
			s := openShaper(t, testPinDir(t))
			defer s.Close()
			const parent, class = 1, 0x10010
			setOwnPodShare(t, s, PodShare{Parent: parent, MAC: mac1.String(), ClassID: class})
			gw := net.HardwareAddr{0x02, 0xee, 0, 0, 0, 1}
			own := ipFrame(gw, mac1, "10.9.0.5", "10.9.0.1", false)
			forged := ipFrame(gw, net.HardwareAddr{0x02, 0xba, 0xd0, 0, 0, 1}, "10.9.0.5", "10.9.0.1", false)
			if ret, prio := runCtx(t, s.objs.ClassifyEgress, own, skbCtx{Ifindex: parent}); ret != tcxNext || prio != class {
				t.Errorf("the pod's own frame: verdict %d, priority %#x; want passed in its class %#x", ret, prio, class)
			}
			if ret, _ := runCtx(t, s.objs.ClassifyEgress, forged, skbCtx{Ifindex: parent}); ret != tcActShot {
				t.Errorf("the pod's frame with a forged MAC: verdict %d; want dropped", ret)
			}
			other, _ := newNS(t)
			var ret int32
			var prio uint32
			if err := inNS(other, func() error {
				ret, prio = runCtx(t, s.objs.ClassifyEgress, forged, skbCtx{Ifindex: parent})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if ret != tcxNext || prio != 0 {
				t.Errorf("a frame from another namespace: verdict %d, priority %#x; want passed, unclassified", ret, prio)
			}
		})
	}
}
