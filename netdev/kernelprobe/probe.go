// Package kernelprobe finds what the running kernel offers for enforcing NIC
// shares by trying it: BPF program and attach types through cilium/ebpf, and
// qdisc, filter, action and link kinds by creating them on a throwaway veth
// in a scratch network namespace, which is gone when the probe returns.
// Many production kernels have neither /proc/config.gz nor
// /boot/config-<release>, and a configuration says what was built, not
// whether the module can be loaded.
package kernelprobe

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/discovery"
)

// Prober probes once and answers every later call from that probe: the
// running kernel does not change, and discovery asks on every link event.
type Prober struct {
	// Root is the host root whose /proc/filesystems says whether resctrl
	// is there ("/" when empty).
	Root string
	once sync.Once
	k    discovery.KernelFeatures
	err  error
}

// Probe returns the running kernel's features; see the package comment.
// It needs CAP_SYS_ADMIN (a network namespace) and CAP_NET_ADMIN.
func (p *Prober) Probe(ctx context.Context) (discovery.KernelFeatures, error) {
	p.once.Do(func() {
		p.k, p.err = probe(ctx, p.Root)
		if p.err == nil {
			klog.FromContext(ctx).V(1).Info("Probed the running kernel", "features", fmt.Sprintf("%+v", p.k))
		}
	})
	return p.k, p.err
}

func probe(ctx context.Context, root string) (discovery.KernelFeatures, error) {
	var k discovery.KernelFeatures
	var err error
	done := make(chan struct{})
	// The probe switches its thread into the scratch namespace; a thread
	// that cannot be switched back is never unlocked, so the runtime
	// ends it with the goroutine.
	go func() {
		defer close(done)
		runtime.LockOSThread()
		orig, oerr := netns.Get()
		if oerr != nil {
			err = fmt.Errorf("this thread's network namespace: %w", oerr)
			runtime.UnlockOSThread()
			return
		}
		defer orig.Close()
		scratch, nerr := netns.New() // and this thread is in it
		if nerr != nil {
			err = fmt.Errorf("a scratch network namespace: %w", nerr)
			runtime.UnlockOSThread()
			return
		}
		k, err = probeIn(ctx)
		scratch.Close() // its last reference: the namespace and its links go
		if serr := netns.Set(orig); serr != nil {
			err = errors.Join(err, fmt.Errorf("back to the original network namespace: %w", serr))
			return
		}
		runtime.UnlockOSThread()
	}()
	<-done
	if err != nil {
		return discovery.KernelFeatures{}, err
	}
	k.Resctrl = hasFilesystem(root, "resctrl")
	return k, nil
}

// probeIn tries everything in the calling thread's (scratch) namespace.
func probeIn(ctx context.Context) (discovery.KernelFeatures, error) {
	logger := klog.FromContext(ctx)
	var k discovery.KernelFeatures
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cvprobe0"}, PeerName: "cvprobe1"}
	if err := netlink.LinkAdd(veth); err != nil {
		return k, fmt.Errorf("a veth to probe on: %w", err)
	}
	dev, err := netlink.LinkByName("cvprobe0")
	if err != nil {
		return k, fmt.Errorf("the probe veth: %w", err)
	}
	if err := netlink.LinkSetUp(dev); err != nil {
		return k, fmt.Errorf("the probe veth up: %w", err)
	}
	idx := dev.Attrs().Index
	tc, err := bpf.ProbeTC(idx)
	if err != nil {
		return k, err
	}
	k.BPF, k.TCX, k.Clsact, k.ClsBPF = tc.SchedCLS, tc.SchedCLS && tc.TCX, tc.Clsact, tc.SchedCLS && tc.ClsBPF

	root := netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}
	k.HTB = tryQdisc(logger, netlink.NewHtb(root))
	k.FQ = tryQdisc(logger, &netlink.Fq{QdiscAttrs: root})

	k.Macvlan = tryLink(logger, &netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: "cvprobemv", ParentIndex: idx}, Mode: netlink.MACVLAN_MODE_VEPA})
	k.IPVlan = tryLink(logger, &netlink.IPVlan{LinkAttrs: netlink.LinkAttrs{Name: "cvprobeip", ParentIndex: idx}, Mode: netlink.IPVLAN_MODE_L2})
	ifb := &netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "cvprobeifb"}}
	if err := netlink.LinkAdd(ifb); err == nil {
		k.IFB = true
	} else {
		logger.V(4).Info("Kernel probe: no ifb", "err", err)
	}

	// u32 and mirred, on the ingress hook as the ingress redirect uses
	// them (clsact, or the ingress qdisc where clsact is missing).
	if !k.Clsact {
		if err := netlink.QdiscAdd(&netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}); err != nil {
			return k, nil // no hook for u32 either
		}
	}
	u32 := func(prio uint16, actions ...netlink.Action) bool {
		f := &netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: netlink.HANDLE_MIN_INGRESS, Priority: prio, Protocol: unix.ETH_P_ALL},
			Sel: &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Nkeys: 1, Keys: []netlink.TcU32Key{{}}}, Actions: actions}
		err := netlink.FilterAdd(f)
		if err != nil {
			logger.V(4).Info("Kernel probe: u32 filter refused", "actions", len(actions), "err", err)
		}
		return err == nil
	}
	k.U32 = u32(1)
	if k.U32 {
		target := idx
		if k.IFB {
			if l, err := netlink.LinkByName("cvprobeifb"); err == nil {
				target = l.Attrs().Index
			}
		}
		k.Mirred = u32(2, netlink.NewMirredAction(target))
	}
	return k, nil
}

func tryQdisc(logger klog.Logger, q netlink.Qdisc) bool {
	if err := netlink.QdiscReplace(q); err != nil {
		logger.V(4).Info("Kernel probe: qdisc refused", "kind", q.Type(), "err", err)
		return false
	}
	return true
}

func tryLink(logger klog.Logger, l netlink.Link) bool {
	if err := netlink.LinkAdd(l); err != nil {
		logger.V(4).Info("Kernel probe: link refused", "kind", l.Type(), "err", err)
		return false
	}
	return true
}

// hasFilesystem reports whether <root>/proc/filesystems lists fs.
func hasFilesystem(root, fs string) bool {
	if root == "" {
		root = "/"
	}
	b, err := os.ReadFile(filepath.Join(root, "proc/filesystems"))
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == fs {
			return true
		}
	}
	return false
}
