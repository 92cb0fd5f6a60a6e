package netdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/hook"

	"github.com/carve-dra/carve/slices/names"
)

var _ prepare.ClaimCleaner = (*NICPreparer)(nil)

// ownerOf is the part of an attach spec that says whose share it is.
func (p *NICPreparer) ownerOf(a prepare.Allocation) hook.AttachSpec {
	spec := hook.AttachSpec{ClaimUID: string(a.ClaimUID), Request: a.Request, Device: a.Device, BootID: p.opts.BootID}
	if a.ShareID != nil {
		spec.ShareID = string(*a.ShareID)
	}
	return spec
}

// allocationOf rebuilds, from an attach spec, the allocation its share was
// made for: enough for Unprepare, which derives every name from the key.
func allocationOf(spec hook.AttachSpec) prepare.Allocation {
	a := prepare.Allocation{ClaimUID: types.UID(spec.ClaimUID), Request: spec.Request, Device: spec.Device, Kind: names.KindNIC}
	if spec.ShareID != "" {
		id := types.UID(spec.ShareID)
		a.ShareID = &id
	}
	return a
}

// specs reads every attach spec on the node, by file.
func (p *NICPreparer) specs() (map[string]hook.AttachSpec, error) {
	files, err := filepath.Glob(filepath.Join(p.opts.StateDir, "netdev", "*.json"))
	if err != nil {
		return nil, err
	}
	out := map[string]hook.AttachSpec{}
	for _, f := range files {
		if spec, err := hook.ReadAttachSpec(f); err == nil {
			out[f] = spec
		}
	}
	return out, nil
}

// UnprepareClaim removes the shares of a claim that the checkpoint does not
// know (it was lost, or a crash came between the share's first step and its
// record): they are found from their attach specs, and removed as a started
// share is.
func (p *NICPreparer) UnprepareClaim(ctx context.Context, uid types.UID) error {
	specs, err := p.specs()
	if err != nil {
		return err
	}
	var errs []error
	for file, spec := range specs {
		if spec.ClaimUID != string(uid) {
			continue
		}
		a := allocationOf(spec)
		if LinkName(a.ShareKey()) != spec.HostName {
			errs = append(errs, fmt.Errorf("attach spec %s does not match its share's names; left alone", file))
			continue
		}
		klog.FromContext(ctx).Info("Removing a NIC share the checkpoint does not know", "claim", uid, "link", spec.HostName, "parent", spec.Parent)
		if err := p.Unprepare(ctx, a, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeSpecsOfOtherBoots deletes the attach specs of an earlier boot: the
// interfaces, classes and pins they describe died with it.
func (p *NICPreparer) removeSpecsOfOtherBoots(ctx context.Context) map[string]hook.AttachSpec {
	specs, err := p.specs()
	if err != nil || p.opts.BootID == "" {
		return specs
	}
	for file, spec := range specs {
		if spec.BootID != "" && spec.BootID != p.opts.BootID {
			if err := os.Remove(file); err == nil || errors.Is(err, os.ErrNotExist) {
				klog.FromContext(ctx).V(2).Info("Removed the attach spec of an earlier boot", "file", file)
				delete(specs, file)
			}
		}
	}
	return specs
}

// macsOf are the share MACs the specs name.
func macsOf(specs map[string]hook.AttachSpec) map[string]bool {
	out := map[string]bool{}
	for _, spec := range specs {
		a := allocationOf(spec)
		if spec.ClaimUID != "" {
			out[ShareMAC(a.ShareKey()).String()] = true
		}
		if spec.MAC != "" {
			out[strings.ToLower(spec.MAC)] = true
		}
	}
	return out
}

// removeOrphanShapers deletes the ingress IFBs and egress shapers whose
// parent is gone: each is named after its parent's ifindex (cvifb<ifindex>,
// cveg<ifindex>), and a parent that was removed (a NIC unplugged, a test's
// veth deleted) before its last share was unprepared leaves them behind,
// with nothing left to shape.
func (p *NICPreparer) removeOrphanShapers(ctx context.Context) {
	links, err := p.h.LinkList()
	if err != nil {
		return
	}
	present := map[int]bool{}
	for _, l := range links {
		present[l.Attrs().Index] = true
	}
	logger := klog.FromContext(ctx)
	for _, l := range links {
		idx, ok := shapedParent(l)
		if !ok || present[idx] {
			continue
		}
		if l.Type() == "veth" {
			if err := p.forgetEgressShaper(idx); err != nil {
				logger.Error(err, "Egress shaper whose parent is gone kept", "shaper", l.Attrs().Name)
				continue
			}
		}
		// An egress shaper's peer goes with it.
		if err := p.h.LinkDel(l); err == nil {
			logger.Info("Removed a shaping device whose parent is gone", "device", l.Attrs().Name)
		}
	}
}

// shapedParent is the ifindex of the parent that l shapes, where l is an
// ingress IFB or the first end of an egress shaper.
func shapedParent(l netlink.Link) (int, bool) {
	for _, dev := range []struct{ prefix, kind string }{{"cvifb", "ifb"}, {"cveg", "veth"}} {
		rest, ok := strings.CutPrefix(l.Attrs().Name, dev.prefix)
		if !ok || l.Type() != dev.kind {
			continue
		}
		if idx, err := strconv.Atoi(rest); err == nil {
			return idx, true
		}
	}
	return 0, false
}
