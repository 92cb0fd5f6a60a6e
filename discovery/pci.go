package discovery

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/jaypipes/ghw"
	"github.com/jaypipes/ghw/pkg/option"

	"k8s.io/klog/v2"
)

var pciAddressPattern = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// listPCI returns every PCI function under the root, keyed by address.
// ghw enumerates them, with vendor and product names from pci.ids (loaded
// once by pcidb and handed to ghw, see pciDBFor). What ghw does not give (the
// NUMA node and the PCIe root) is read beside it, a few files per function.
// Where ghw cannot run (no pci.ids) or drops functions (it gives up on the
// whole bus, without an error, when one function lacks a modalias), the IDs
// read from sysfs are published without names.
func (t tree) listPCI(ctx context.Context) (map[string]PCIFunction, error) {
	const dir = "sys/bus/pci/devices"
	entries, err := os.ReadDir(t.path(dir))
	if os.IsNotExist(err) {
		return map[string]PCIFunction{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", t.path(dir), err)
	}
	devices, ok, err := t.openDir(dir)
	if err != nil || !ok {
		return map[string]PCIFunction{}, err
	}
	defer devices.close()
	fns := make([]PCIFunction, len(entries))
	err = forEach(len(entries), func(i int) (err error) {
		fns[i], err = t.readPCI(devices, entries[i].Name())
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]PCIFunction, len(fns))
	for _, f := range fns {
		out[f.Address] = f
	}
	if db := pciDBFor(ctx, t.root); db != nil {
		info, err := ghw.PCI(ghw.WithChroot(t.root), option.WithPCIDB(db), ghw.WithDisableTools(), ghw.WithDisableTopology(), ghw.WithDisableWarnings())
		switch {
		case err != nil:
			klog.FromContext(ctx).V(4).Info("PCI functions without names", "reason", err)
		case len(info.Devices) != len(out):
			klog.FromContext(ctx).V(4).Info("PCI functions without names: ghw skipped functions", "ghw", len(info.Devices), "sysfs", len(out))
		default:
			for _, d := range info.Devices {
				if f, ok := out[d.Address]; ok {
					if d.Vendor != nil {
						f.VendorName = knownName(d.Vendor.Name)
					}
					if d.Product != nil {
						f.ProductName = knownName(d.Product.Name)
					}
					out[d.Address] = f
				}
			}
		}
	}
	return out, nil
}

func knownName(s string) string {
	if s == "unknown" {
		return ""
	}
	return s
}

// readPCI reads one function of sys/bus/pci/devices.
func (t tree) readPCI(devices dir, addr string) (PCIFunction, error) {
	if !pciAddressPattern.MatchString(addr) {
		return PCIFunction{}, fmt.Errorf("PCI function %q under %s: not a domain:bus:device.function address", addr, t.path("sys/bus/pci/devices"))
	}
	f := PCIFunction{Address: addr, NUMANode: -1}
	if target, ok, err := devices.optionalLink(addr); err != nil {
		return PCIFunction{}, err
	} else if ok {
		f.PCIeRoot = pcieRootOf(addr, target)
	}
	d, ok, err := devices.openDir(addr)
	if err != nil || !ok {
		return f, err
	}
	defer d.close()
	modalias, ok, err := d.optionalString("modalias")
	if err != nil {
		return PCIFunction{}, err
	}
	if !ok || !parseModalias(modalias, &f) {
		for _, field := range []struct {
			file string
			dst  *string
		}{{"vendor", &f.VendorID}, {"device", &f.DeviceID}, {"class", &f.Class}} {
			v, _, err := d.optionalString(field.file)
			if err != nil {
				return PCIFunction{}, err
			}
			*field.dst = strings.ToLower(v)
		}
	}
	if n, ok, err := d.optionalInt("numa_node"); err != nil {
		return PCIFunction{}, err
	} else if ok {
		f.NUMANode = int(n)
	}
	f.Driver = d.linkBase("driver")
	return f, nil
}

// parseModalias fills the IDs and class from a PCI modalias,
// "pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00", and reports
// whether it had that form.
func parseModalias(s string, f *PCIFunction) bool {
	// v, d, sv, sd: 8 hex digits each; bc, sc, i: 2.
	if len(s) < 53 || !strings.HasPrefix(s, "pci:v") || s[13] != 'd' || s[22:24] != "sv" || s[32:34] != "sd" ||
		s[42:44] != "bc" || s[46:48] != "sc" || s[50] != 'i' {
		return false
	}
	lower := strings.ToLower(s)
	f.VendorID = "0x" + lower[9:13]
	f.DeviceID = "0x" + lower[18:22]
	f.Class = "0x" + lower[44:46] + lower[48:50] + lower[51:53]
	return true
}

// pcieRootOf is the root complex a function hangs off, from the target of
// its sys/bus/pci/devices link: "../../../devices/pci0000:16/0000:16:02.0/
// 0000:17:00.0" gives "pci0000:16". A target of another form gives "", as
// deviceattribute.GetPCIeRootAttributeByPCIBusID does.
func pcieRootOf(addr, target string) string {
	if !filepath.IsAbs(target) {
		target = filepath.Join("bus/pci/devices", target)
	} else if i := strings.Index(target, "/devices/pci"); i >= 0 {
		target = target[i+1:]
	}
	if !strings.HasPrefix(target, "devices/pci") || filepath.Base(target) != addr {
		return ""
	}
	root, _, _ := strings.Cut(strings.TrimPrefix(target, "devices/"), "/")
	return root
}

// sortedPCI returns the functions in address order, so that discovery output
// is stable.
func sortedPCI(fns map[string]PCIFunction) []PCIFunction {
	out := make([]PCIFunction, 0, len(fns))
	for _, f := range fns {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out
}
