package discovery

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/jaypipes/pcidb"
	"golang.org/x/sys/unix"
)

// pciIDsPaths are where distributions put pci.ids, in the order pcidb
// searches them.
var pciIDsPaths = []string{"usr/share/hwdata/pci.ids", "usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids.gz", "usr/share/misc/pci.ids.gz"}

// pciIDsStamp names the pci.ids file PCI functions are named from, by path,
// inode, size and modification time: a package update replaces the file
// (a new inode) or rewrites it (a new size or time), and renames what it
// lists. A Scanner reads it again only when the stamp changes or a
// function's IDs appear that its last read did not name.
type pciIDsStamp struct {
	path    string
	ino     uint64
	size    int64
	modTime time.Time
}

// pciIDsStampFor finds the pci.ids that ghw would read, as pcidb looks for
// it: $PCIDB_PATH where set, else $PCIDB_CACHE_PATH (by default
// ~/.cache/pci.ids), else the distributions' paths below $PCIDB_CHROOT (by
// default "/": the agent's image, not --root). The zero stamp means there is
// none: functions are then published with IDs only.
func pciIDsStampFor() pciIDsStamp {
	var candidates []string
	if p := os.Getenv("PCIDB_PATH"); p != "" {
		candidates = []string{p}
	} else {
		cache, ok := os.LookupEnv("PCIDB_CACHE_PATH")
		if !ok {
			if home, err := os.UserHomeDir(); err == nil {
				cache = filepath.Join(home, ".cache", "pci.ids")
			}
		}
		if cache != "" {
			candidates = append(candidates, cache)
		}
		chroot := os.Getenv("PCIDB_CHROOT")
		if chroot == "" {
			chroot = "/"
		}
		for _, p := range pciIDsPaths {
			candidates = append(candidates, filepath.Join(chroot, p))
		}
	}
	for _, p := range candidates {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			s := pciIDsStamp{path: p, size: st.Size(), modTime: st.ModTime()}
			if sys, ok := st.Sys().(*syscall.Stat_t); ok {
				s.ino = sys.Ino
			}
			return s
		}
	}
	return pciIDsStamp{}
}

// pciNames names the vendor and device ID pairs ids from the pci.ids stamp
// names, as ghw would: the vendor's and the product's names as pcidb parses
// them, "" where pci.ids lists neither.
//
// ghw (v0.26 and v0.27) cannot be asked for names alone: ghw.PCI reads
// every function again (six files and links each, which discovery reads
// itself) and has pcidb parse the whole pci.ids, 1.3 MB and some 40,000
// lines, of which a node's few vendors are a small part; a database handed
// to it (WithPCIDB) it ignores. That was half of a first discovery's CPU
// time on a large node and nearly all of its allocations. So pcidb, ghw's
// own parser, is handed a pci.ids cut down to the blocks of the vendors
// the node has, without the subsystems and device classes, which carve
// does not publish: its parse is then a few hundred lines, and the names
// are those it gives from the whole file.
func pciNames(stamp pciIDsStamp, ids []pciID) (map[pciID][2]string, error) {
	vendors := make(map[string]bool)
	for _, id := range ids {
		if v, ok := hexID(id.vendor); ok {
			vendors[v] = true
		}
	}
	var reduced bytes.Buffer
	if err := reducePCIIDs(stamp.path, vendors, &reduced); err != nil {
		return nil, err
	}
	db, err := parsePCIIDs(reduced.Bytes())
	if err != nil {
		return nil, fmt.Errorf("parse pci.ids %s: %w", stamp.path, err)
	}
	named := make(map[pciID][2]string, len(ids))
	for _, id := range ids {
		var n [2]string
		v, vok := hexID(id.vendor)
		d, dok := hexID(id.device)
		if vok {
			if vendor := db.Vendors[v]; vendor != nil {
				n[0] = knownName(vendor.Name)
			}
			if product := db.Products[v+d]; dok && product != nil {
				n[1] = knownName(product.Name)
			}
		}
		named[id] = n
	}
	return named, nil
}

// hexID is the form pcidb keys IDs by ("10de") of carve's ("0x10de").
func hexID(id string) (string, bool) {
	h, ok := strings.CutPrefix(id, "0x")
	return h, ok && len(h) == 4
}

// knownName is ghw's name for what pci.ids does not list ("unknown") as "".
func knownName(s string) string {
	if s == "unknown" {
		return ""
	}
	return s
}

// reducePCIIDs copies to dst the vendor lines of pci.ids at path whose IDs
// are in vendors, each with its device lines: what pcidb needs to name
// those vendors and their devices as it does from the whole file. Comments,
// subsystem lines, other vendors and the device classes are left out, and
// so are lines too short for pcidb, which slices them by position and would
// panic on them. A .gz file is read through gzip, as pcidb reads it.
func reducePCIIDs(path string, vendors map[string]bool, dst *bytes.Buffer) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("read pci.ids: %w", err)
	}
	defer func() { _ = f.Close() }() // only read
	var src io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		z, err := gzip.NewReader(f)
		if err != nil {
			return fmt.Errorf("read pci.ids %s: %w", path, err)
		}
		defer func() { _ = z.Close() }() // only read; a corrupt stream fails the reads
		src = z
	}
	// Lines are split as pcidb splits them (bufio.ScanLines drops a
	// "\r" before the "\n"), with its bound on a line's length.
	lines := bufio.NewScanner(src)
	keep := false
	for lines.Scan() {
		line := lines.Bytes()
		switch {
		case len(line) == 0 || line[0] == '#':
			// Comments and blank lines: pcidb skips them too.
		case line[0] == 'C':
			// A device class: classes close a vendor's block and are
			// not needed.
			keep = false
		case line[0] != '\t':
			// A vendor: "10de  NVIDIA Corporation".
			keep = len(line) >= 4 && vendors[string(line[:4])] && utf8.RuneCount(line) >= 6
			if keep {
				dst.Write(line)
				dst.WriteByte('\n')
			}
		case len(line) > 1 && line[1] != '\t':
			// A device of the last vendor: "\t2330  GH100 [H100 SXM5 80GB]".
			if keep && utf8.RuneCount(line) >= 7 {
				dst.Write(line)
				dst.WriteByte('\n')
			}
		default:
			// A subsystem: its name is not published.
		}
	}
	if err := lines.Err(); err != nil {
		return fmt.Errorf("read pci.ids %s: %w", path, err)
	}
	return nil
}

// parsePCIIDs has pcidb parse a pci.ids given in memory. pcidb reads only
// files it opens itself by path, so the text is put in a memory file
// (memfd), which needs no writable directory (the agent's image has none)
// and is gone when it is closed, and pcidb opens it through /proc/self/fd.
func parsePCIIDs(text []byte) (*pcidb.PCIDB, error) {
	fd, err := unix.MemfdCreate("carve-pci.ids", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memory file: %w", err)
	}
	f := os.NewFile(uintptr(fd), "carve-pci.ids")
	defer func() { _ = f.Close() }() // memory, gone once pcidb has read it
	if _, err := f.Write(text); err != nil {
		return nil, fmt.Errorf("write memory file: %w", err)
	}
	path := fmt.Sprintf("/proc/self/fd/%d", fd)
	// pcidb fetches pci.ids from the Internet where the path is missing
	// and $PCIDB_ENABLE_NETWORK_FETCH is set: never for a node's names.
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("memory file: %w", err)
	}
	db, err := pcidb.New(pcidb.WithPath(path))
	if err != nil {
		return nil, fmt.Errorf("pcidb: %w", err)
	}
	return db, nil
}
