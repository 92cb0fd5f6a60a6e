package netdev

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/prepare"
)

// Unprepare removes the share's classifier entries, classes, interface,
// addresses and attach spec. With no undo record (a crash came before
// Prepare returned) it finds them from the allocation: the names and the
// MAC derive from the share's key, and the classifier maps the MAC to its
// classes.
func (p *NICPreparer) Unprepare(ctx context.Context, a prepare.Allocation, raw json.RawMessage) error {
	p.tcMu.Lock()
	defer p.tcMu.Unlock()
	unlock, err := p.lockNode()
	if err != nil {
		return err
	}
	defer unlock()
	return p.unprepare(ctx, a, raw)
}

func (p *NICPreparer) unprepare(ctx context.Context, a prepare.Allocation, raw json.RawMessage) error {
	key := a.ShareKey()
	u := undoRecord{Link: LinkName(key), MAC: ShareMAC(key).String()}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &u); err != nil {
			return fmt.Errorf("undo record: %w", err)
		}
	}
	mac, _ := net.ParseMAC(u.MAC)
	var errs []error
	if p.opts.Shaper != nil {
		shares, err := p.opts.Shaper.Shares()
		if err != nil {
			errs = append(errs, err)
		}
		for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
			classid, ok := shares[bpf.Key{MAC: mac.String(), Dir: dir}]
			if !ok {
				continue
			}
			if err := p.opts.Shaper.DeleteShare(dir, mac); err != nil {
				errs = append(errs, err)
			}
			_, minor := netlink.MajorMinor(classid)
			if dir == bpf.Egress && u.EgressMinor == 0 {
				u.EgressMinor = minor
			}
			if dir == bpf.Ingress && u.IngressMinor == 0 {
				u.IngressMinor = minor
			}
		}
	}
	if p.opts.Shaper != nil {
		// Idempotent, and harmless where the share was never paced.
		if err := p.opts.Shaper.SetRate(mac, 0); err != nil {
			errs = append(errs, err)
		}
		// The hook's pod entries, found by the share's MAC alone.
		if err := p.opts.Shaper.DeletePodShares(mac); err != nil {
			errs = append(errs, err)
		}
	}
	if u.Parent == "" {
		// Without a record: the attach spec names the parent, else the
		// link (if still on the node) does.
		if spec, err := ReadAttachSpec(p.specPath(u.Link)); err == nil {
			u.Parent = spec.Parent
		} else {
			u.Parent = p.parentOf(u.Link)
		}
	}
	if parent, err := p.h.LinkByName(u.Parent); err == nil {
		if u.EgressMinor != 0 {
			errs = append(errs, deleteClass(p.h, parent, u.EgressMinor), removeHTBIfIdle(p.h, parent))
		}
		if ifb, err := p.h.LinkByName(ifbName(parent)); err == nil && u.IngressMinor != 0 {
			errs = append(errs, deleteClass(p.h, ifb, u.IngressMinor), p.removeIngressIFBIfIdle(parent))
		}
	}
	if link, err := p.h.LinkByName(u.Link); err == nil {
		if err := p.h.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", u.Link, err))
		}
	}
	// A link already moved into the pod goes with the pod's namespace;
	// a classifier link pinned for a device whose namespace is gone is
	// dead weight.
	if p.opts.PinDir != "" {
		if _, err := bpf.CleanupDefunct(p.opts.PinDir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(p.specPath(u.Link)); err != nil && !os.IsNotExist(err) {
		errs = append(errs, err)
	}
	p.ipam.release(key)
	p.freeMinors(key)
	p.mu.Lock()
	delete(p.labels, u.MAC)
	p.mu.Unlock()
	err := errors.Join(errs...)
	klog.FromContext(ctx).V(2).Info("Unprepared NIC share", "parent", u.Parent, "link", u.Link, "mac", u.MAC,
		"egressClass", u.EgressMinor, "ingressClass", u.IngressMinor, "err", err)
	return err
}

// parentOf finds the parent of a share's link still on the node; "" when
// the link is gone.
func (p *NICPreparer) parentOf(linkName string) string {
	link, err := p.h.LinkByName(linkName)
	if err != nil || link.Attrs().ParentIndex == 0 {
		return ""
	}
	parent, err := p.h.LinkByIndex(link.Attrs().ParentIndex)
	if err != nil {
		return ""
	}
	return parent.Attrs().Name
}
