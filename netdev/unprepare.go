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
	"github.com/carve-dra/carve/prepare/hook"
	"github.com/carve-dra/carve/slices/names"
)

// Unprepare releases the share at once: its classifier entries go (its
// traffic is no longer charged or shaped from the next frame on), and its
// addresses go back to the pool. Its classes are parked for the next share
// on their device (park.go); what it cannot park there, its interface and
// its attach spec are queued for the reaper, on disk, before it returns. With
// no undo record (a
// crash came before Prepare returned) it finds them from the allocation: the
// names and the MAC derive from the share's key, and the classifier maps the
// MAC to its classes.
func (p *NICPreparer) Unprepare(ctx context.Context, a prepare.Allocation, raw json.RawMessage) error {
	return p.unprepare(ctx, a, raw)
}

func (p *NICPreparer) unprepare(ctx context.Context, a prepare.Allocation, raw json.RawMessage) error {
	key := a.ShareKey()
	u := undoRecord{Link: LinkName(key), MAC: ShareMAC(key).String()}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &u); err != nil {
			return fmt.Errorf("undo record: %w", err)
		}
		// The names come from the key, as prepare made them: a
		// damaged record must not point the removal at another link
		// or file.
		u.Link, u.MAC = LinkName(key), ShareMAC(key).String()
	}
	if err := p.releasePoolAddrs(ctx, key, u.PoolAddrs); err != nil {
		return fmt.Errorf("free the share's pool addresses: %w", err)
	}
	mac, _ := net.ParseMAC(u.MAC)
	var errs []error
	if p.opts.Shaper != nil {
		if len(raw) == 0 {
			// No record: the classifier names the classes.
			errs = append(errs, p.minorsFromClassifier(mac, &u))
		}
		for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
			errs = append(errs, p.opts.Shaper.DeleteShare(dir, mac))
		}
		// Idempotent, and harmless where the share was never paced.
		errs = append(errs, p.opts.Shaper.SetRate(mac, 0))
		// The hook's pod entries, found by the share's MAC alone.
		errs = append(errs, p.opts.Shaper.DeletePodShares(mac))
		if p.opts.PinDir != "" {
			// The pod guard, by the share's name.
			errs = append(errs, bpf.UnpinPodGuard(p.opts.PinDir, u.Link))
		}
		// Addresses of a share told apart by address (ipvlan); without
		// a record any share may have some.
		errs = append(errs, p.forgetAddresses(mac, u.AddressKeyed || len(raw) == 0))
	}
	if err := errors.Join(errs...); err != nil {
		// Nothing queued: the kubelet retries, and the entries that
		// went are gone for good.
		return err
	}
	if u.Parent == "" {
		// Without a record: the attach spec names the parent, else the
		// link (if still on the node) does.
		if spec, err := hook.ReadAttachSpec(p.specPath(u.Link)); err == nil {
			u.Parent = spec.Parent
		} else {
			u.Parent = p.parentOf(u.Link)
		}
	}
	// The spec is set aside first: the addresses it names are free again
	// (pool allocation reads the specs on disk), while the reaper still
	// has to remove the interface.
	if err := os.Rename(p.specPath(u.Link), p.specPath(u.Link)+reapingSuffix); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("set the attach spec of %s aside: %w", u.Link, err)
	}
	egressRate, ingressRate := bandwidth(a, names.CapEgressBandwidth), bandwidth(a, names.CapIngressBandwidth)
	retired, checkIdle := p.retireAtUnprepare(key, &u, egressRate, ingressRate)
	it := reapItem{Key: key, Parent: u.Parent, Link: u.Link, EgressMinor: u.EgressMinor, IngressMinor: u.IngressMinor, FlowClasses: u.FlowClasses,
		EgressRate: egressRate, IngressRate: ingressRate, CheckIdle: checkIdle}
	if err := p.reaper.enqueue(it); err != nil {
		return err
	}
	// Queued with its retired blocks left out: they are another's now.
	p.publishRetired(retired)
	p.ipam.release(key)
	p.releaseShare(key)
	p.releaseExcess(ctx, key, u.Parent)
	p.mu.Lock()
	delete(p.labels, u.MAC)
	delete(p.nestedRemoved, u.MAC)
	p.mu.Unlock()
	klog.FromContext(ctx).V(2).Info("Unprepared NIC share; its classes and interface are being removed", "parent", u.Parent, "link", u.Link, "mac", u.MAC,
		"egressClass", u.EgressMinor, "ingressClass", u.IngressMinor)
	return nil
}

// minorsFromClassifier fills in u's class minors from the classifier's
// entries for mac.
func (p *NICPreparer) minorsFromClassifier(mac net.HardwareAddr, u *undoRecord) error {
	shares, err := p.opts.Shaper.Shares()
	if err != nil {
		return err
	}
	if classid, ok := shares[bpf.Key{MAC: mac.String(), Dir: bpf.Egress}]; ok && u.EgressMinor == 0 {
		_, u.EgressMinor = netlink.MajorMinor(classid)
	}
	if classid, ok := shares[bpf.Key{MAC: mac.String(), Dir: bpf.Ingress}]; ok && u.IngressMinor == 0 {
		_, u.IngressMinor = netlink.MajorMinor(classid)
	}
	return nil
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
