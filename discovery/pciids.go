package discovery

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jaypipes/pcidb"
	"k8s.io/klog/v2"
)

// pciIDsPaths are where distributions put pci.ids, in the order pcidb
// searches them.
var pciIDsPaths = []string{"usr/share/hwdata/pci.ids", "usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids.gz", "usr/share/misc/pci.ids.gz"}

// pciDBCache holds the last pci.ids database loaded (by pcidb, ghw's own
// reader), for as long as its file is unchanged: discovery runs on every
// link event, and ghw would otherwise parse pci.ids again on every call,
// which took most of discovery's time and memory.
var pciDBCache struct {
	sync.Mutex
	path    string
	size    int64
	modTime time.Time
	db      *pcidb.PCIDB
}

// pciDBFor finds pci.ids: $PCIDB_PATH where set (as for pcidb), else below
// root, else below "/" (the agent's image carries one where the host has
// none), and loads it once. nil where there is none: functions are then
// published with IDs only.
func pciDBFor(ctx context.Context, root string) *pcidb.PCIDB {
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
		st, err := os.Stat(p)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		pciDBCache.Lock()
		defer pciDBCache.Unlock()
		c := &pciDBCache
		if c.db != nil && c.path == p && c.size == st.Size() && c.modTime.Equal(st.ModTime()) {
			return c.db
		}
		db, err := pcidb.New(pcidb.WithPath(p))
		if err != nil {
			klog.FromContext(ctx).V(2).Info("pci.ids unreadable; publishing PCI IDs without names", "path", p, "err", err)
			return nil
		}
		c.path, c.size, c.modTime, c.db = p, st.Size(), st.ModTime(), db
		return db
	}
	return nil
}
