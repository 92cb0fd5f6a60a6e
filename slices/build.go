package slices

import (
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/cbm"
	"github.com/carve-dra/carve/slices/names"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// Result is a node's pool and what an operator should know about it.
type Result struct {
	Resources resourceslice.DriverResources
	// Index finds a published device, with the inventory item it came
	// from, by its name.
	Index map[string]Entry
	// Notices say what was found but cannot be offered fully, such as a
	// link of unknown speed or a kernel that cannot enforce shares.
	Notices []string
}

// Entry is a published device and what discovery knows of it. Exactly one of
// NIC, LLC, FPGA and GPU is set, matching Kind.
type Entry struct {
	Kind   string
	Device resourceapi.Device
	NIC    *discovery.NIC
	LLC    *discovery.LLC
	FPGA   *discovery.FPGA
	// GPU is set for the kinds gpu and mig.
	GPU *GPU
}

// Option tells Build what it cannot read from the inventory.
type Option func(*builder)

// NoNICs leaves the node's NICs out of its pool, noting why for each: a
// node whose kernel carve cannot guard a NIC claim on (below its minimum:
// no classifier, no pod guard) offers none.
func NoNICs(why string) Option {
	return func(b *builder) { b.noNICs = why }
}

// ClassifierShares says how many shares the node's BPF classifier holds,
// every NIC together (bpf.Shaper.ShareSlots). Without it Build assumes
// DefaultClassifierShares.
func ClassifierShares(n int) Option {
	return func(b *builder) { b.classifierShares = n }
}

// MIGOwned tells Build which existing GPU instances the agent made (a
// claim's, by its parent's UUID, its profile's Id and its placement's
// start): those keep their placements published, allocated to their claims.
// The placements of every other instance (made by hand, or by another
// tool) are left out of the pool, since the driver would refuse them. Without
// it, every existing instance is taken as another's (carve discover).
func MIGOwned(owned func(uuid string, profileID, start int) bool) Option {
	return func(b *builder) { b.migOwned = owned }
}

const (
	// DefaultClassifierShares is how many shares this build's classifier
	// holds (bpf.CompiledShareSlots: its maps of 4096 entries, two a
	// share). Build assumes it where no classifier is loaded, as `carve
	// discover` does, so that discover prints what the agent publishes (a
	// loaded classifier has its compiled size).
	DefaultClassifierShares = 2048
	// HTBClassesPerParent is how many shares' HTB classes netdev hands
	// out on one parent's egress shaper, and again on its IFB: a block of
	// 16 class minors a share and direction (its class and its flow
	// children), from 0x10 to 0xffef.
	HTBClassesPerParent = (0xfff0 - 0x10) / 16
)

// Build makes the node's pool. Devices are ordered by name, so the output is
// stable, and the pool is split into as many slices as the API's per-slice
// limit requires.
func Build(inv *discovery.Inventory, cfg *nodeconfig.NodeConfig, nodeName string, opts ...Option) Result {
	b := builder{cfg: cfg, kernel: inv.Kernel, classifierShares: DefaultClassifierShares}
	for _, o := range opts {
		o(&b)
	}
	var entries []Entry
	limits := b.shareLimits(inv.NICs)
	for i := range inv.NICs {
		if b.noNICs != "" {
			b.notef("NIC %s: %s; not offered", inv.NICs[i].Name, b.noNICs)
			continue
		}
		entries = append(entries, Entry{Kind: names.KindNIC, Device: b.nic(inv.NICs[i], limits[i]), NIC: &inv.NICs[i]})
	}
	dedupeNames(entries)
	for i := range inv.LLCs {
		entries = append(entries, Entry{Kind: names.KindLLC, Device: b.llc(inv.LLCs[i]), LLC: &inv.LLCs[i]})
	}
	for i := range inv.FPGAs {
		entries = append(entries, Entry{Kind: names.KindFPGA, Device: b.fpga(inv.FPGAs[i]), FPGA: &inv.FPGAs[i]})
	}
	gpus, counterSets := b.gpus(inv)
	entries = append(entries, gpus...)
	index := make(map[string]Entry, len(entries))
	devices := make([]resourceapi.Device, 0, len(entries))
	for _, e := range entries {
		index[e.Device.Name] = e
		devices = append(devices, e.Device)
	}
	sortDevices(devices)
	return Result{
		Resources: resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
			nodeName: {Slices: split(devices, counterSets)},
		}},
		Index:   index,
		Notices: b.notices,
	}
}

type builder struct {
	cfg    *nodeconfig.NodeConfig
	kernel discovery.KernelFeatures
	// noNICs, where set, is why the node offers no NIC (NoNICs).
	noNICs string
	// classifierShares is how many shares the classifier holds, every
	// NIC together.
	classifierShares int
	// migOwned tells the GPU instances the agent made (MIGOwned).
	migOwned func(uuid string, profileID, start int) bool
	notices  []string
}

func (b *builder) notef(format string, args ...any) {
	b.notices = append(b.notices, fmt.Sprintf(format, args...))
}

// shareLimits is the "shares" capacity of each NIC: the smallest of its part
// of the classifier, the HTB classes a parent can hand out, and the node
// config's netdev.maxSharesPerNIC; 0 for a NIC that can never be shared
// here. The classifier's room is divided among the NICs this kernel could
// share (their bandwidth known), up or not: a NIC whose link went down keeps
// its part, as its shares may still hold their entries, and the others'
// limits do not move with a link's state. Each gets the quotient, and the
// first ones in the inventory's order one more each, until the remainder is
// spent: together they never hold more than the classifier. A NIC that gets
// none is published whole (more NICs than the classifier has shares).
func (b *builder) shareLimits(nics []discovery.NIC) []int64 {
	limits := make([]int64, len(nics))
	if !b.kernel.Known || !b.kernel.CanShareNIC() {
		return limits
	}
	var candidates []int
	for i, n := range nics {
		if _, _, known := b.bandwidth(n); known {
			candidates = append(candidates, i)
		}
	}
	if len(candidates) == 0 {
		return limits
	}
	room := int64(max(b.classifierShares, 0))
	each, rest := room/int64(len(candidates)), room%int64(len(candidates))
	for k, i := range candidates {
		part := each
		if int64(k) < rest {
			part++
		}
		limits[i] = min(part, HTBClassesPerParent, b.cfg.SharesPerNIC())
	}
	return limits
}

// nic is the device of a NIC whose "shares" capacity, where it can be
// shared, is shareLimit.
func (b *builder) nic(n discovery.NIC, shareLimit int64) resourceapi.Device {
	d := newDevice(names.KindNIC, nicName(n))
	setString(d, names.AttrIfName, n.Name)
	setString(d, names.AttrMAC, n.MAC)
	if n.MTU > 0 {
		setInt(d, "mtu", int64(n.MTU))
	}
	setString(d, "driver", n.Driver)
	setBool(d, "virtual", n.Virtual)
	if n.PCI != nil {
		setPCI(d, *n.PCI)
	}
	if n.SRIOV != nil {
		setInt(d, "sriovTotalVFs", int64(n.SRIOV.TotalVFs))
		setInt(d, "sriovNumVFs", int64(n.SRIOV.NumVFs))
	}
	setString(d, "sriovPhysFn", n.PhysFn)

	egress, ingress, known := b.bandwidth(n)
	if !known {
		b.notef("NIC %s: link speed unknown and no netdev.bandwidth entry in the node config; published without bandwidth, not shareable", n.Name)
		return *d
	}
	if pct := b.cfg.Netdev.UnsharedFloorPercent; pct > 0 {
		// The traffic of no share is assured pct of the link
		// (netdev's unshared class): the shares' floors, which the
		// scheduler keeps within what is published, get the rest.
		egress, ingress = partOf(egress, 100-pct), partOf(ingress, 100-pct)
	}
	shareable := b.nicShareable(n)
	if shareable && shareLimit < 1 {
		b.notef("NIC %s: the classifier's %d shares are all given to other NICs (netdev.exclude the NICs that need none); published as a whole device", n.Name, b.classifierShares)
		shareable = false
	}
	d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		names.CapEgressBandwidth:  b.capacity(names.KindNIC, names.CapEgressBandwidth, egress, shareable, defaultBandwidthPolicy(egress)),
		names.CapIngressBandwidth: b.capacity(names.KindNIC, names.CapIngressBandwidth, ingress, shareable, defaultBandwidthPolicy(ingress)),
	}
	if shareable {
		d.Capacity[names.CapShares] = sharesCapacity(shareLimit)
		d.AllowMultipleAllocations = ptr.To(true)
	}
	return *d
}

// sharesCapacity is a NIC's "shares" capacity: limit shares, of which every
// allocation consumes exactly 1, asked or not (a claim asking for more than
// 1 fits no device). No step: the API wants min + step within the value,
// which a limit of 1 could not hold. Not configurable by requestPolicies.
func sharesCapacity(limit int64) resourceapi.DeviceCapacity {
	one := func() *resource.Quantity { return resource.NewQuantity(1, resource.DecimalSI) }
	return resourceapi.DeviceCapacity{
		Value: *resource.NewQuantity(limit, resource.DecimalSI),
		RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: one(),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: one(), Max: one()}},
	}
}

// bandwidth is the NIC's capacity in bits per second: the link speed where
// the kernel knows it, else the node config's entry for the interface.
//
// The node config's entry for the link wins over the speed the kernel
// reports: the operator's figure for a link whose real capacity is
// elsewhere (a port shaped upstream, a veth's nominal 10G), which borrowing
// shares' link class and the scheduler both take as the link's.
func (b *builder) bandwidth(n discovery.NIC) (egress, ingress resource.Quantity, known bool) {
	if eg, in, ok := b.cfg.BandwidthFor(n.Name); ok {
		return eg, in, true
	}
	if n.SpeedMbps > 0 {
		q := *resource.NewQuantity(n.SpeedMbps*1_000_000, resource.DecimalSI)
		return q, q, true
	}
	return resource.Quantity{}, resource.Quantity{}, false
}

// nicShareable reports whether this node can hold bandwidth shares of the NIC
// to their allocation, and notes why not where it cannot.
func (b *builder) nicShareable(n discovery.NIC) bool {
	switch {
	case !b.kernel.Known:
		b.notef("NIC %s: the kernel's configuration could not be read (proc/config.gz, boot/config-<release>); bandwidth shares not offered", n.Name)
	case !b.kernel.CanShareNIC():
		b.notef("NIC %s: this kernel cannot enforce bandwidth shares (tc BPF %t, egress shaping %t, ingress shaping %t, macvlan/ipvlan %t); published as a whole device",
			n.Name, b.kernel.CanAttachTC(), b.kernel.CanShapeEgress(), b.kernel.CanShapeIngress(), b.kernel.Macvlan || b.kernel.IPVlan)
	case !n.LinkUsable():
		b.notef("NIC %s: link is %s (carrier %t); not offered for sharing until it is up", n.Name, n.OperState, n.Carrier)
	default:
		return true
	}
	return false
}

func (b *builder) llc(l discovery.LLC) resourceapi.Device {
	d := newDevice(names.KindLLC, fmt.Sprintf("llc-%d", l.ID))
	setInt(d, names.AttrCacheID, int64(l.ID))
	if len(l.CPUs) <= resourceapi.DeviceAttributeMaxValueLength {
		setString(d, names.AttrCPUs, l.CPUs)
	} else {
		b.notef("LLC %d: CPU list is longer than an attribute may be (%d characters); cpus omitted", l.ID, resourceapi.DeviceAttributeMaxValueLength)
	}
	setBool(d, "resctrl", l.Resctrl != nil)

	ways, size := l.Ways, l.SizeBytes
	shareable := b.llcShareable(l)
	if l.Resctrl != nil {
		// resctrl allocates by capacity bitmask bits; those are the ways
		// a share can be given.
		ways = discovery.MaskWays(l.Resctrl.CBMMask)
	}
	if ways <= 0 || l.SizeBytes <= 0 {
		b.notef("LLC %d: ways or size unknown; published without capacities", l.ID)
		return *d
	}
	wayBytes := l.SizeBytes / int64(ways)
	minWays := int64(1)
	if shareable {
		// What shares can have: the default group keeps its ways.
		minWays = int64(l.Resctrl.MinCBMBits)
		ways = cbm.ShareWays(l.Resctrl.CBMMask, l.Resctrl.ShareableBM, l.Resctrl.MinCBMBits)
		size = int64(ways) * wayBytes
	}
	d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		names.CapWays: b.capacity(names.KindLLC, names.CapWays, *resource.NewQuantity(int64(ways), resource.DecimalSI), shareable,
			policy(minWays, minWays, 1)),
		names.CapSize: b.capacity(names.KindLLC, names.CapSize, *resource.NewQuantity(size, resource.BinarySI), shareable,
			policy(minWays*wayBytes, wayBytes, wayBytes)),
	}
	if shareable {
		if m := l.Resctrl.MBA; m != nil {
			// A cap per share, 0 (no cap) unless asked: the scheduler
			// keeps the caps of a domain's shares within its maximum.
			d.Capacity[names.CapMemoryBandwidth] = b.capacity(names.KindLLC, names.CapMemoryBandwidth, *resource.NewQuantity(int64(m.Max), resource.DecimalSI), true,
				policy(0, 0, int64(m.Gran)))
		}
		d.AllowMultipleAllocations = ptr.To(true)
	}
	return *d
}

// llcShareable reports whether resctrl can hold way shares of a cache to
// their masks, and notes why not where it cannot.
func (b *builder) llcShareable(l discovery.LLC) bool {
	rc := l.Resctrl
	switch {
	case rc == nil:
		b.notef("LLC %d: resctrl is not mounted (or has no L3 allocation); cache ways cannot be partitioned, published as a whole device", l.ID)
	case rc.NumCLOSIDs < 2:
		b.notef("LLC %d: resctrl has %d CLOSID(s), none beyond the default group's; published as a whole device", l.ID, rc.NumCLOSIDs)
	case cbm.ShareWays(rc.CBMMask, rc.ShareableBM, rc.MinCBMBits) < rc.MinCBMBits:
		b.notef("LLC %d: resctrl leaves no ways for shares beside the default group's min_cbm_bits (cbm_mask %x, shareable_bits %x); published as a whole device",
			l.ID, rc.CBMMask, rc.ShareableBM)
	default:
		return true
	}
	return false
}

func (b *builder) fpga(f discovery.FPGA) resourceapi.Device {
	d := newDevice(names.KindFPGA, pciName(names.KindFPGA, f.Address))
	setPCI(d, f.PCIFunction)
	setString(d, names.AttrVendorID, f.VendorID)
	setString(d, names.AttrDeviceID, f.DeviceID)
	setString(d, "driver", f.Driver)
	setString(d, names.AttrCompatID, f.CompatID)
	setString(d, names.AttrAFUID, f.AFUID)
	return *d
}

// capacity is a device's capacity with, when the device is shareable, the
// configured request policy or else the built-in one.
func (b *builder) capacity(kind string, name resourceapi.QualifiedName, value resource.Quantity, shareable bool, builtin nodeconfig.Policy) resourceapi.DeviceCapacity {
	c := resourceapi.DeviceCapacity{Value: value}
	if !shareable {
		return c
	}
	pol, ok := b.cfg.Policy(kind, string(name))
	if !ok {
		pol = builtin
	}
	rp := &resourceapi.CapacityRequestPolicy{Default: ptr.To(pol.Default)}
	if pol.Min != nil || pol.Step != nil || pol.Max != nil {
		rp.ValidRange = &resourceapi.CapacityRequestPolicyRange{Min: pol.Min, Max: pol.Max, Step: pol.Step}
		if rp.ValidRange.Min == nil {
			rp.ValidRange.Min = ptr.To(resource.MustParse("0"))
		}
	}
	// A policy must fit the device: clamp what the config asks to the
	// device's own capacity rather than publish an unsatisfiable slice.
	if rp.Default.Cmp(value) > 0 {
		rp.Default = ptr.To(value.DeepCopy())
	}
	if r := rp.ValidRange; r != nil {
		if r.Max != nil && r.Max.Cmp(value) > 0 {
			r.Max = ptr.To(value.DeepCopy())
		}
		if r.Min.Cmp(*rp.Default) > 0 {
			r.Min = ptr.To(rp.Default.DeepCopy())
		}
	}
	c.RequestPolicy = rp
	return c
}

// defaultBandwidthPolicy: a share gets 1% of the link unless it asks, and may
// ask for any multiple of 1 Mbit/s from 1 Mbit/s up.
func defaultBandwidthPolicy(link resource.Quantity) nodeconfig.Policy {
	def := link.Value() / 100
	if def < 1_000_000 {
		def = 1_000_000
	}
	def -= def % 1_000_000
	return policy(def, 1_000_000, 1_000_000)
}

func policy(def, minimum, step int64) nodeconfig.Policy {
	return nodeconfig.Policy{
		Default: *resource.NewQuantity(def, resource.DecimalSI),
		Min:     resource.NewQuantity(minimum, resource.DecimalSI),
		Step:    resource.NewQuantity(step, resource.DecimalSI),
	}
}

func newDevice(kind, name string) *resourceapi.Device {
	// Sized for a NIC's (up to 14): growing it was a fifth of Build's bytes.
	d := &resourceapi.Device{Name: name, Attributes: make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, 14)}
	setString(d, names.AttrKind, kind)
	return d
}

func setPCI(d *resourceapi.Device, f discovery.PCIFunction) {
	setString(d, names.AttrPCIAddress, f.Address)
	if f.PCIeRoot != "" {
		setString(d, deviceattribute.StandardDeviceAttributePCIeRoot, f.PCIeRoot)
	}
	if f.NUMANode >= 0 {
		setInt(d, names.AttrNUMANode, int64(f.NUMANode))
		setInt(d, deviceattribute.StandardDeviceAttributeNUMANode, int64(f.NUMANode))
	}
	setString(d, "vendorName", f.VendorName)
	setString(d, names.AttrProductName, f.ProductName)
}

// setString sets a string attribute, cut to the API's value limit; empty
// values are left out.
func setString(d *resourceapi.Device, name resourceapi.QualifiedName, v string) {
	if v == "" {
		return
	}
	if len(v) > resourceapi.DeviceAttributeMaxValueLength {
		v = v[:resourceapi.DeviceAttributeMaxValueLength]
	}
	d.Attributes[name] = resourceapi.DeviceAttribute{StringValue: &v}
}

func setInt(d *resourceapi.Device, name resourceapi.QualifiedName, v int64) {
	d.Attributes[name] = resourceapi.DeviceAttribute{IntValue: &v}
}

func setBool(d *resourceapi.Device, name resourceapi.QualifiedName, v bool) {
	d.Attributes[name] = resourceapi.DeviceAttribute{BoolValue: &v}
}

var nonNameChars = regexp.MustCompile(`[^a-z0-9-]+`)

// pciName derives a device name from a PCI address: 0000:1a:00.0 becomes
// <kind>-0000-1a-00-0. PCI addresses are stable across reboots; interface
// names can change with udev rules.
func pciName(kind, addr string) string {
	return kind + "-" + strings.ReplaceAll(strings.ReplaceAll(addr, ":", "-"), ".", "-")
}

// nicName names a NIC by its PCI function, with the port where one function
// carries several netdevs; virtual NICs by their interface name.
func nicName(n discovery.NIC) string {
	if n.PCI != nil {
		name := pciName(names.KindNIC, n.PCI.Address)
		if n.DevPort > 0 {
			name += fmt.Sprintf("-p%d", n.DevPort)
		}
		return name
	}
	return "nic-" + sanitize(n.Name)
}

// sanitize makes an interface name a DNS label fragment.
func sanitize(s string) string {
	s = strings.Trim(nonNameChars.ReplaceAllString(strings.ToLower(s), "-"), "-")
	if len(s) > 50 {
		s = s[:50]
	}
	if s == "" {
		s = "x"
	}
	return s
}

// dedupeNames keeps names unique where sanitizing folded two interface names
// together (eth_0 and eth.0), by appending the interface name's hash.
func dedupeNames(entries []Entry) {
	count := map[string]int{}
	for _, e := range entries {
		count[e.Device.Name]++
	}
	for i := range entries {
		if count[entries[i].Device.Name] > 1 {
			h := fnv.New32a()
			_, _ = h.Write([]byte(entries[i].NIC.Name)) // a hash.Hash's Write never fails
			entries[i].Device.Name = fmt.Sprintf("%s-%08x", entries[i].Device.Name, h.Sum32())
		}
	}
}

// partOf is pct percent of a bandwidth q (bits per second), rounded down.
func partOf(q resource.Quantity, pct int) resource.Quantity {
	return *resource.NewQuantity(q.Value()/100*int64(pct)+q.Value()%100*int64(pct)/100, resource.DecimalSI)
}
