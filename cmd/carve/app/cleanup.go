package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/cdi"
	"github.com/carve-dra/carve/prepare/checkpoint"
	"github.com/carve-dra/carve/prepare/hostmount"
	"github.com/carve-dra/carve/slices/names"
)

// CleanupOptions say where an agent kept its state on a node: the agent's
// own flags.
type CleanupOptions struct {
	DriverName string
	// Root is the host's root; its proc/1/ns/net is the node's network
	// namespace unless HostNetns names one.
	Root, HostNetns             string
	StateDir, BPFPinDir, CDIDir string
	RegistrarDir, PluginsDir    string
	// Force cleans up even while claims are prepared: their NIC shares'
	// interfaces are deleted from their pods, so that no pod goes on
	// sending unshaped. Without it, prepared claims make CleanupNode
	// refuse (ErrClaimsPrepared) and change nothing.
	Force bool
	// HostMountNS is the host's mount namespace, entered to unmount what
	// the chart's init container bind-mounted (the state directory onto
	// itself); empty leaves mounts alone.
	HostMountNS string
}

// ErrClaimsPrepared is CleanupNode's refusal: the node still has prepared
// claims, which a cleanup would leave unenforced.
var ErrClaimsPrepared = errors.New("claims are still prepared on this node")

// CleanupNode removes what carve's agent leaves on a node between claims,
// once no agent runs there: its links (each parent's IFB and egress
// shaper, shares' interfaces on the node), its BPF pins (the classifier's
// maps, and links, which detach with them), its CDI specs, its kubelet
// plugin sockets, and its state directory. It returns what it removed. With
// claims still prepared it refuses unless o.Force. Running it again finds
// nothing to do.
func CleanupNode(ctx context.Context, o CleanupOptions) ([]string, error) {
	logger := klog.FromContext(ctx)
	if sock := liveAgent(o.PluginsDir, o.DriverName); sock != "" {
		return nil, fmt.Errorf("an agent serves this node (it answers on %s): stop it first (helm uninstall, or delete its DaemonSet), which cleans up as it stops", sock)
	}
	claims, err := preparedClaims(o.Root, o.StateDir)
	if err != nil {
		return nil, err
	}
	var removed []string
	hostNS, err := openHostNetns(o.Root, o.HostNetns)
	if err != nil {
		return nil, err
	}
	defer hostNS.Close()
	if len(claims) > 0 {
		if !o.Force {
			return nil, fmt.Errorf("%w: %s; delete their pods first (or clean up with --force, which takes their devices from them)",
				ErrClaimsPrepared, describeClaims(claims))
		}
		logger.Info("Cleaning up with claims still prepared: their shares are taken from their pods", "claims", describeClaims(claims))
		var macs []string
		for _, c := range claims {
			macs = append(macs, shareMACs(c)...)
		}
		gone, err := netdev.RemoveShareLinksInPods(o.Root, hostNS, macs)
		removed = append(removed, prefixed("share interface in pod, pid:link ", gone)...)
		if err != nil {
			return removed, err
		}
	}

	var errs []error
	h, err := netlink.NewHandleAt(hostNS)
	if err != nil {
		return removed, fmt.Errorf("netlink in the node's network namespace: %w", err)
	}
	links, err := netdev.RemoveNodeLinks(h)
	h.Close()
	removed = append(removed, prefixed("link ", links)...)
	errs = append(errs, err)

	if o.BPFPinDir != "" {
		if _, err := os.Stat(o.BPFPinDir); err == nil {
			if err := bpf.RemovePinDir(o.BPFPinDir); err != nil {
				errs = append(errs, err)
			} else {
				removed = append(removed, "BPF pins "+o.BPFPinDir)
			}
		}
	}
	if o.CDIDir != "" {
		specs, err := cdi.RemoveAll(o.CDIDir, o.DriverName)
		removed = append(removed, prefixed("CDI spec ", specs)...)
		errs = append(errs, err)
	}
	sockets, err := removePluginSockets(o.RegistrarDir, o.PluginsDir, o.DriverName)
	removed = append(removed, sockets...)
	errs = append(errs, err)
	state, err := removeStateDir(o.StateDir, o.HostMountNS)
	removed = append(removed, state...)
	errs = append(errs, err)
	return removed, errors.Join(errs...)
}

// preparedClaims reads the checkpoint's records of this boot; none where
// the state directory holds no checkpoint.
func preparedClaims(root, stateDir string) ([]prepare.ClaimRecord, error) {
	if _, err := os.Stat(checkpoint.Path(stateDir)); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	records, err := prepare.ReadRecords(root, stateDir)
	if err != nil {
		return nil, err
	}
	out := make([]prepare.ClaimRecord, 0, len(records))
	for _, r := range records {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name })
	return out, nil
}

func describeClaims(claims []prepare.ClaimRecord) string {
	s := make([]string, len(claims))
	for i, c := range claims {
		s[i] = c.Namespace + "/" + c.Name
	}
	return fmt.Sprintf("%d claim(s): %s", len(claims), strings.Join(s, ", "))
}

// shareMACs are the MACs of a claim's NIC shares, by their undo records;
// where a record is missing the share's key names it.
func shareMACs(c prepare.ClaimRecord) []string {
	var macs []string
	for i, a := range c.Allocations {
		if a.Kind != names.KindNIC {
			continue
		}
		if i < len(c.Undo) {
			if u, err := netdev.DecodeShareRecord(c.Undo[i]); err == nil && u.MAC != "" {
				macs = append(macs, u.MAC)
				continue
			}
		}
		macs = append(macs, netdev.ShareMAC(a.ShareKey()).String())
	}
	return macs
}

// liveAgent is the DRA socket of a driver's agent that answers on it, if
// any: in the driver's own plugin directory, whatever the socket's name
// (one per agent pod with rolling updates).
func liveAgent(pluginsDir, driver string) string {
	if pluginsDir == "" {
		return ""
	}
	dir := filepath.Join(pluginsDir, driver)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".sock") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if c, err := net.DialTimeout("unix", p, time.Second); err == nil {
			c.Close()
			return p
		}
	}
	return ""
}

// removePluginSockets removes the driver's kubelet plugin directory and
// its registration sockets (one per agent pod with rolling updates).
func removePluginSockets(registrarDir, pluginsDir, driver string) ([]string, error) {
	var removed []string
	var errs []error
	if pluginsDir != "" {
		dir := filepath.Join(pluginsDir, driver)
		if _, err := os.Stat(dir); err == nil {
			if err := os.RemoveAll(dir); err != nil {
				errs = append(errs, err)
			} else {
				removed = append(removed, "kubelet plugin directory "+dir)
			}
		}
	}
	if registrarDir != "" {
		entries, err := os.ReadDir(registrarDir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), driver+"-") || !strings.HasSuffix(e.Name(), "reg.sock") {
				continue
			}
			p := filepath.Join(registrarDir, e.Name())
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, "registration socket "+p)
		}
	}
	return removed, errors.Join(errs...)
}

// removeStateDir removes the state directory's contents (the checkpoint,
// the hook binary, attach specs, the reaper's queue) and, in the host's
// mount namespace, the directory's bind mount onto itself and the directory.
func removeStateDir(dir, hostMountNS string) ([]string, error) {
	if dir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("state directory %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		// os.RemoveAll would empty a file system mounted below (a
		// claim's MPS tmpfs, after a forced cleanup) and then fail on
		// its mount point: one is left, named.
		if below, err := hostmount.HasMountBelow(p); err != nil || below {
			errs = append(errs, fmt.Errorf("%s: a file system is mounted there; left (unmount it, then remove it)", p))
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	var removed []string
	if len(entries) > 0 {
		removed = append(removed, "state in "+dir)
	}
	if hostMountNS == "" {
		return removed, errors.Join(errs...)
	}
	err = hostmount.InNamespace(hostMountNS, func() error {
		if did, err := hostmount.RemoveSelfBind(dir); err != nil {
			return err
		} else if did {
			removed = append(removed, "bind mount "+dir)
		}
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", dir, err)
		} else if err == nil {
			removed = append(removed, "state directory "+dir)
		}
		return nil
	})
	return removed, errors.Join(append(errs, err)...)
}

func prefixed(p string, s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = p + x
	}
	return out
}
