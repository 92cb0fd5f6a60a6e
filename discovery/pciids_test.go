package discovery

import (
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jaypipes/ghw"

	"github.com/carve-dra/carve/discovery/sysfstest"
)

// namesTree is a node with functions of vendors and devices pci.ids lists,
// of a listed vendor's unlisted device, and of an unlisted vendor.
func namesTree(t *testing.T) *sysfstest.Tree {
	tree := sysfstest.Typical(t.TempDir())
	tree.AddPCI("0000:e0:00.0", sysfstest.PCI{Vendor: sysfstest.VendorNVIDIA, Device: 0xfff0, Class: sysfstest.Class3DGPU})
	tree.AddPCI("0000:e1:00.0", sysfstest.PCI{Vendor: 0xfffe, Device: 0x0001, Class: 0x058000})
	tree.AddPCI("0000:e2:00.0", sysfstest.PCI{Vendor: 0x1d0f, Device: 0xcd01, Class: 0x010802})
	return tree
}

// ghwNamesOf is what ghw.PCI names the tree's functions, by address: what
// carve published before it named them itself.
func ghwNamesOf(t *testing.T, root string) map[string][2]string {
	t.Helper()
	info, err := ghw.PCI(ghw.WithChroot(root), ghw.WithDisableTools(), ghw.WithDisableTopology(), ghw.WithDisableWarnings())
	if err != nil {
		t.Fatalf("ghw: %v", err)
	}
	out := map[string][2]string{}
	for _, d := range info.Devices {
		out[d.Address] = [2]string{knownName(d.Vendor.Name), knownName(d.Product.Name)}
	}
	return out
}

// checkNamesAsGhw scans root and compares every function's names with
// ghw's, and wants at least one function named (a database that names
// nothing would pass otherwise).
func checkNamesAsGhw(t *testing.T, root string) {
	t.Helper()
	want := ghwNamesOf(t, root)
	scan, _, err := tree{root: root}.scanPCI(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(scan.fns) != len(want) {
		t.Fatalf("scanned %d functions, ghw %d", len(scan.fns), len(want))
	}
	named := 0
	for _, f := range scan.fns {
		got := [2]string{f.VendorName, f.ProductName}
		if got != want[f.Address] {
			t.Errorf("%s (%s:%s): names %q, ghw's %q", f.Address, f.VendorID, f.DeviceID, got, want[f.Address])
		}
		if got[0] != "" && got[1] != "" {
			named++
		}
	}
	if named == 0 {
		t.Errorf("no function named from %s", pciIDsStampFor().path)
	}
}

// The system's pci.ids names every function as ghw, which reads all of
// it, does.
func TestPCINamesAsGhw(t *testing.T) {
	if pciIDsStampFor().path == "" {
		t.Skip("no pci.ids here (Debian package pci.ids): names cannot be compared")
	}
	checkNamesAsGhw(t, namesTree(t).Root)
}

// craftedPCIIDs has what pci.ids may have beside vendor blocks: comments
// and blank lines inside blocks, subsystems, CRLF line ends, names beyond
// ASCII, the device classes (which end a vendor's block), and a vendor
// after them.
const craftedPCIIDs = "# header comment\n" +
	"\n" +
	"10de  NVIDIA Corporation\r\n" +
	"\t2330  GH100 [H100 SXM5 80GB]\n" +
	"# a comment inside the block\n" +
	"\t\t10de 16c1  H100 SXM5 80GB\n" +
	"\n" +
	"\t2331  GH100 [H100 PCIe]\n" +
	"15b3  Mellanox Technologies\n" +
	"\t101d  MT2892 Family [ConnectX-6 Dx]\n" +
	"\t101e  ConnectX Family mlx5Gen Virtual Function\n" +
	"8086  Intel Corporation\n" +
	"\t347a  Ice Lake Memory Map/VT-d\n" +
	"C 02  Network controller\n" +
	"\t00  Ethernet controller\n" +
	"\t\t00  plain\n" +
	"1af4  Red Hat, Inc.\n" +
	"\t1041  Virtio 1.0 network device\n" +
	"10ee  Xilinx Corporation — ünïcode\n" +
	"\t5004  Alveo U250 — ünïcode\n"

// A crafted pci.ids, plain and gzipped, names as ghw does.
func TestPCINamesAsGhwCrafted(t *testing.T) {
	root := namesTree(t).Root
	dir := t.TempDir()
	plain := filepath.Join(dir, "pci.ids")
	if err := os.WriteFile(plain, []byte(craftedPCIIDs), 0o644); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	if _, err := w.Write([]byte(craftedPCIIDs)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	zipped := filepath.Join(dir, "pci.ids.gz")
	if err := os.WriteFile(zipped, gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{plain, zipped} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			t.Setenv("PCIDB_PATH", path)
			checkNamesAsGhw(t, root)
		})
	}
}

// Lines too short for pcidb, which slices lines by position and panics on
// them, are left out; the vendors' other lines still name.
func TestPCINamesMalformedLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pci.ids")
	text := "10d\n" + // a vendor line cut short
		"10de  NVIDIA Corporation\n" +
		"\t23\n" + // a device line cut short
		"\t\n" +
		"\t\t1\n" +
		"\t2330  GH100 [H100 SXM5 80GB]\n" +
		"15b3 \n" + // a vendor with no name: its devices go with it
		"\t101d  MT2892 Family [ConnectX-6 Dx]\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PCIDB_PATH", path)
	nvidia, cx6 := pciID{"0x10de", "0x2330"}, pciID{"0x15b3", "0x101d"}
	named, err := pciNames(pciIDsStampFor(), []pciID{nvidia, cx6})
	if err != nil {
		t.Fatal(err)
	}
	if got := named[nvidia]; got != [2]string{"NVIDIA Corporation", "GH100 [H100 SXM5 80GB]"} {
		t.Errorf("NVIDIA H100 named %q", got)
	}
	if got := named[cx6]; got != [2]string{} {
		t.Errorf("ConnectX-6 of a vendor line without a name named %q, want none", got)
	}
}

// The cut-down pci.ids holds the node's vendors only, without
// subsystems or classes: what makes naming cheap.
func TestReducePCIIDs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pci.ids")
	if err := os.WriteFile(path, []byte(craftedPCIIDs), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := reducePCIIDs(path, map[string]bool{"10de": true, "1af4": true}, &out); err != nil {
		t.Fatal(err)
	}
	want := "10de  NVIDIA Corporation\n\t2330  GH100 [H100 SXM5 80GB]\n\t2331  GH100 [H100 PCIe]\n1af4  Red Hat, Inc.\n\t1041  Virtio 1.0 network device\n"
	if out.String() != want {
		t.Errorf("reduced:\n%q\nwant:\n%q", out.String(), want)
	}
}

// Whatever pci.ids holds, naming from it does not panic (pcidb slices
// lines by position), names every ID it is asked for, and gives only
// names that are in the file.
func FuzzPCINames(f *testing.F) {
	f.Add(craftedPCIIDs)
	f.Add("10d\n10de  NVIDIA Corporation\n\t23\n\t\n\t\t1\n\t2330  GH100\n15b3 \n\t101d  MT2892\n")
	f.Add("10de\n\t2330\n10de  \n\t2330  \nC 0\n\t0\n10de  x\r\n\t2330  y\r\n")
	// One file, written again for each input: a worker runs its inputs
	// one at a time.
	path := filepath.Join(f.TempDir(), "pci.ids")
	f.Fuzz(func(t *testing.T, text string) {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		// Ask for what the file lists, as far as it looks like IDs.
		ids := []pciID{{"0x10de", "0x2330"}}
		vendor := ""
		for line := range strings.Lines(text) {
			switch {
			case len(line) >= 4 && line[0] != '\t':
				vendor = line[:4]
			case len(line) >= 5 && line[0] == '\t' && line[1] != '\t':
				ids = append(ids, pciID{"0x" + vendor, "0x" + line[1:5]})
			}
		}
		named, err := pciNames(pciIDsStamp{path: path}, ids)
		if err != nil {
			return // a line longer than pcidb reads
		}
		// pcidb reads lines as runes: a byte that is not UTF-8 becomes
		// U+FFFD, in ghw's names as in these.
		asRunes := string([]rune(text))
		for _, id := range ids {
			n, ok := named[id]
			if !ok {
				t.Fatalf("%v not named", id)
			}
			for _, name := range n {
				if !strings.Contains(asRunes, name) {
					t.Fatalf("%v named %q, which the file does not hold", id, name)
				}
			}
		}
	})
}
