package discovery

import (
	"os"
	"path/filepath"
	"time"
)

// pciIDsPaths are where distributions put pci.ids, in the order pcidb
// searches them.
var pciIDsPaths = []string{"usr/share/hwdata/pci.ids", "usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids.gz", "usr/share/misc/pci.ids.gz"}

// pciIDsStamp names the pci.ids file ghw names PCI functions from, by path,
// size and modification time. ghw (v0.26 and v0.27) parses pci.ids again on
// every ghw.PCI call: it keeps a database handed to it (option.WithPCIDB) in
// its context but never reads it there, so a database loaded here would be
// parsed once more for nothing (about 20 ms and 12 MB on this machine). A
// Scanner instead asks ghw again only when the PCI functions or this stamp
// change: an updated pci.ids renames what it lists.
type pciIDsStamp struct {
	path    string
	size    int64
	modTime time.Time
}

// pciIDsStampFor finds the pci.ids ghw reads, as pcidb looks for it:
// $PCIDB_PATH where set, else $PCIDB_CACHE_PATH (by default
// ~/.cache/pci.ids), else the distributions' paths below $PCIDB_CHROOT
// (by default "/": the agent's image, not --root). The zero stamp means
// there is none: functions are then published with IDs only.
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
			return pciIDsStamp{path: p, size: st.Size(), modTime: st.ModTime()}
		}
	}
	return pciIDsStamp{}
}
