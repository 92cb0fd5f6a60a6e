package discovery

import (
	"os"
	"path/filepath"
	"time"
)

// pciIDsPaths are where distributions put pci.ids, in the order pcidb
// searches them.
var pciIDsPaths = []string{"usr/share/hwdata/pci.ids", "usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids.gz", "usr/share/misc/pci.ids.gz"}

// pciIDsStamp names the pci.ids file PCI names can come from, by path, size
// and modification time. ghw (v0.26 and v0.27) parses pci.ids again on every
// ghw.PCI call: it keeps a database handed to it (option.WithPCIDB) in its
// context but never reads it there, so a database loaded here would be
// parsed once more for nothing (about 20 ms and 12 MB). A Scanner instead
// calls ghw again only when the PCI functions or this stamp change: an
// updated pci.ids renames what it lists.
type pciIDsStamp struct {
	path    string
	size    int64
	modTime time.Time
}

// pciIDsStampFor finds pci.ids: $PCIDB_PATH where set (as for pcidb), else
// below root, else below "/" (the agent's image carries one where the host
// has none). The zero stamp means there is none: functions are then
// published with IDs only.
func pciIDsStampFor(root string) pciIDsStamp {
	var candidates []string
	if p := os.Getenv("PCIDB_PATH"); p != "" {
		candidates = []string{p}
	} else {
		for _, r := range []string{root, "/"} {
			for _, p := range pciIDsPaths {
				candidates = append(candidates, filepath.Join(r, p))
			}
			if r == "/" || filepath.Clean(root) == "/" {
				break
			}
		}
	}
	for _, p := range candidates {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return pciIDsStamp{path: p, size: st.Size(), modTime: st.ModTime()}
		}
	}
	return pciIDsStamp{}
}
