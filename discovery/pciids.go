package discovery

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// pciNames are the vendor and product names of one pci.ids file: vendor
// lines ("10de  NVIDIA Corporation") keyed "10de", device lines below them
// ("\t2330  GH100 [H100 SXM5 80GB]") keyed "10de:2330". Subsystem and class
// lines are not kept: discovery publishes neither.
type pciNames struct {
	path    string
	size    int64
	modTime time.Time
	names   map[string]string
}

// lookup returns the names of a vendor and product given as "0x10de" and
// "0x2330"; "" where the database does not know them.
func (n *pciNames) lookup(vendorID, deviceID string) (vendor, product string) {
	v := strings.TrimPrefix(vendorID, "0x")
	return n.names[v], n.names[v+":"+strings.TrimPrefix(deviceID, "0x")]
}

// pciIDsPaths are where distributions put pci.ids, in the order pcidb
// searches them.
var pciIDsPaths = []string{"usr/share/hwdata/pci.ids", "usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids.gz", "usr/share/misc/pci.ids.gz"}

// pciNamesCache holds the last database parsed, for as long as its file is
// unchanged: discovery runs on every link event, and parsing pci.ids took
// most of its time and memory.
var pciNamesCache struct {
	sync.Mutex
	last *pciNames
}

// pciNamesFor finds pci.ids: $PCIDB_PATH where set (as for pcidb), else
// below root, else below "/" (the agent's image carries one where the host
// has none). nil where there is none: functions are then published with IDs
// only.
func pciNamesFor(ctx context.Context, root string) *pciNames {
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
		pciNamesCache.Lock()
		defer pciNamesCache.Unlock()
		if c := pciNamesCache.last; c != nil && c.path == p && c.size == st.Size() && c.modTime.Equal(st.ModTime()) {
			return c
		}
		names, err := parsePCIIDsFile(p)
		if err != nil {
			klog.FromContext(ctx).V(2).Info("pci.ids unreadable; publishing PCI IDs without names", "path", p, "err", err)
			return nil
		}
		pciNamesCache.last = &pciNames{path: p, size: st.Size(), modTime: st.ModTime(), names: names}
		return pciNamesCache.last
	}
	return nil
}

func parsePCIIDsFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		// pci.ids is a few MiB; the limit guards against a corrupt stream.
		if b, err = io.ReadAll(io.LimitReader(zr, 64<<20)); err != nil {
			return nil, err
		}
	}
	return parsePCIIDs(string(b)), nil
}

// parsePCIIDs reads the vendor and device lines of pci.ids, up to the
// device classes ("C 00  Unclassified device"). Names are substrings of
// text, which the map keeps alive: one allocation for the whole file.
func parsePCIIDs(text string) map[string]string {
	names := make(map[string]string, 1<<15)
	vendor := ""
	for len(text) > 0 {
		line := text
		if i := strings.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			text = ""
		}
		switch {
		case line == "" || line[0] == '#':
		case strings.HasPrefix(line, "C "):
			return names
		case line[0] != '\t':
			id, name, ok := splitIDLine(line)
			if !ok {
				vendor = ""
				continue
			}
			vendor = id
			names[id] = name
		case len(line) > 1 && line[1] != '\t' && vendor != "":
			if id, name, ok := splitIDLine(line[1:]); ok {
				names[vendor+":"+id] = name
			}
		}
	}
	return names
}

// splitIDLine splits "10de  NVIDIA Corporation" into its lower-case id and
// its name.
func splitIDLine(line string) (id, name string, ok bool) {
	if len(line) < 7 || line[4] != ' ' || line[5] != ' ' {
		return "", "", false
	}
	return strings.ToLower(line[:4]), strings.TrimSpace(line[6:]), true
}
