package main

import "strings"

// Floor is a layer of the house: a package may import packages on lower
// floors, and packages of its own top-level folder on its own floor.
type Floor struct {
	Level int
	Name  string
	// Packages are import paths relative to the module; "x/..." is x and
	// everything under it. The longest match decides a package's floor.
	Packages []string
}

// Layers is carve's declared layering, top to bottom; the README draws it.
var Layers = []Floor{
	{7, "end-to-end tests, the local cluster's tools", []string{"deploy/..."}},
	{6, "binaries: flags", []string{"cmd/carve", "cmd/carve-hook"}},
	{5, "composition root: wires every kind into the plugin", []string{"cmd/carve/app/...", "cmd/carve/sharelist/..."}},
	{4, "device kinds, beside each other", []string{"netdev/...", "gpu/...", "prepare/fpga/...", "prepare/llc/..."}},
	{3, "plugin core: kubelet plugin, checkpoint, CDI, status, claim API, runtime hooks", []string{"prepare/..."}},
	{2, "slice builder: inventory and node config to ResourceSlices", []string{"slices/..."}},
	{1, "what the hardware and kernel say; BPF objects; shared test kits", []string{"discovery/...", "bpf/..."}},
}

// floorOf is the floor of a package path relative to the module, or 0 when
// no floor declares it (which Check reports: every package has a place).
func floorOf(rel string) (Floor, bool) {
	best, bestLen, found := Floor{}, -1, false
	for _, f := range Layers {
		for _, p := range f.Packages {
			n := matchLen(p, rel)
			if n > bestLen {
				best, bestLen, found = f, n, true
			}
		}
	}
	return best, found
}

// matchLen is how specific pattern p is for rel: its length when it
// matches, -1 otherwise.
func matchLen(p, rel string) int {
	if base, ok := strings.CutSuffix(p, "/..."); ok {
		if rel == base || strings.HasPrefix(rel, base+"/") {
			return len(base)
		}
		return -1
	}
	if rel == p {
		return len(p) + 1 // an exact path beats a tree of the same length
	}
	return -1
}

// topFolder is a package's top-level folder.
func topFolder(rel string) string {
	top, _, _ := strings.Cut(rel, "/")
	return top
}
