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
	"github.com/jaypipes/ghw/pkg/pci"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"
)

var pciAddressPattern = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// listPCI returns every PCI function under the root, keyed by address. It asks
// ghw first; when ghw cannot run because the pci.ids database is missing, it
// reads the same IDs from sysfs so that discovery still publishes IDs, only
// without vendor and product names.
func (t tree) listPCI(ctx context.Context) (map[string]PCIFunction, error) {
	logger := klog.FromContext(ctx)
	info, err := ghw.PCI(ghw.WithChroot(t.root), ghw.WithDisableTools(), ghw.WithDisableTopology(), ghw.WithDisableWarnings())
	var fns []PCIFunction
	if err == nil {
		for _, d := range info.Devices {
			fns = append(fns, fromGHW(d))
		}
	}
	// ghw gives up on the whole bus, without an error, when one function
	// lacks a modalias; a count that differs from the directory's means
	// that happened.
	if entries, _ := os.ReadDir(t.path("sys/bus/pci/devices")); err != nil || len(fns) != len(entries) {
		reason := "ghw skipped functions"
		if err != nil {
			reason = err.Error()
		}
		logger.V(4).Info("Reading PCI IDs from sysfs without names", "reason", reason)
		if fns, err = t.readPCIIDs(); err != nil {
			return nil, err
		}
	}
	out := make(map[string]PCIFunction, len(fns))
	for _, f := range fns {
		if err := t.completePCI(&f); err != nil {
			return nil, err
		}
		out[f.Address] = f
	}
	return out, nil
}

func fromGHW(d *pci.Device) PCIFunction {
	f := PCIFunction{Address: d.Address, Driver: d.Driver}
	if d.Vendor != nil {
		f.VendorID, f.VendorName = "0x"+strings.ToLower(d.Vendor.ID), knownName(d.Vendor.Name)
	}
	if d.Product != nil {
		f.DeviceID, f.ProductName = "0x"+strings.ToLower(d.Product.ID), knownName(d.Product.Name)
	}
	if d.Class != nil && d.Subclass != nil {
		pi := "00"
		if d.ProgrammingInterface != nil && d.ProgrammingInterface.ID != "" {
			pi = d.ProgrammingInterface.ID
		}
		f.Class = strings.ToLower("0x" + d.Class.ID + d.Subclass.ID + pi)
	}
	return f
}

func knownName(s string) string {
	if s == "unknown" {
		return ""
	}
	return s
}

// readPCIIDs is the fallback for a host without pci.ids: the vendor, device and
// class files hold everything but the names.
func (t tree) readPCIIDs() ([]PCIFunction, error) {
	dir := "sys/bus/pci/devices"
	entries, err := os.ReadDir(t.path(dir))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", t.path(dir), err)
	}
	var fns []PCIFunction
	for _, e := range entries {
		f := PCIFunction{Address: e.Name(), Driver: t.linkBase(filepath.Join(dir, e.Name(), "driver"))}
		for _, field := range []struct {
			file string
			dst  *string
		}{{"vendor", &f.VendorID}, {"device", &f.DeviceID}, {"class", &f.Class}} {
			v, _, err := t.optionalString(filepath.Join(dir, e.Name(), field.file))
			if err != nil {
				return nil, err
			}
			*field.dst = strings.ToLower(v)
		}
		fns = append(fns, f)
	}
	return fns, nil
}

// completePCI adds what ghw does not give: the NUMA node and the PCIe root.
func (t tree) completePCI(f *PCIFunction) error {
	if !pciAddressPattern.MatchString(f.Address) {
		return fmt.Errorf("PCI function %q under %s: not a domain:bus:device.function address", f.Address, t.path("sys/bus/pci/devices"))
	}
	rel := filepath.Join("sys/bus/pci/devices", f.Address)
	f.NUMANode = -1
	if n, ok, err := t.optionalInt(filepath.Join(rel, "numa_node")); err != nil {
		return err
	} else if ok {
		f.NUMANode = int(n)
	}
	if attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(f.Address, deviceattribute.WithFSFromRoot(t.path("sys"))); err == nil && attr.Value.StringValue != nil {
		f.PCIeRoot = *attr.Value.StringValue
	}
	return nil
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
