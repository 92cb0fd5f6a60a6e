package main

import (
	"fmt"
	"sort"
	"strings"
)

// Package is what Check needs of one package: its path and what it (and
// its tests) import.
type Package struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// Violation is one import that runs against the layering.
type Violation struct {
	From, To string
	Reason   string
}

func (v Violation) String() string { return fmt.Sprintf("%s imports %s: %s", v.From, v.To, v.Reason) }

// Check returns every import of the module's packages (tests included:
// a test helper on a high floor is as much a tangle as code) that goes up a
// floor, or across to another top-level folder on the same floor.
func Check(module string, pkgs []Package) []Violation {
	var out []Violation
	for _, p := range pkgs {
		from, ok := strings.CutPrefix(p.ImportPath, module+"/")
		if !ok {
			continue
		}
		from = strings.TrimSuffix(from, "_test")
		ff, ok := floorOf(from)
		if !ok {
			out = append(out, Violation{From: from, Reason: "the package has no declared floor"})
			continue
		}
		seen := map[string]bool{}
		for _, imp := range concat(p.Imports, p.TestImports, p.XTestImports) {
			to, ok := strings.CutPrefix(imp, module+"/")
			if !ok || seen[to] || to == from {
				continue
			}
			seen[to] = true
			tf, ok := floorOf(to)
			switch {
			case !ok:
				out = append(out, Violation{from, to, "the imported package has no declared floor"})
			case tf.Level > ff.Level:
				out = append(out, Violation{from, to, fmt.Sprintf("floor %d (%s) reaches up to floor %d (%s)", ff.Level, ff.Name, tf.Level, tf.Name)})
			case tf.Level == ff.Level && topFolder(to) != topFolder(from):
				out = append(out, Violation{from, to, fmt.Sprintf("%s/ and %s/ share floor %d and must not import each other", topFolder(from), topFolder(to), ff.Level)})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

func concat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}
