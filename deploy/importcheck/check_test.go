package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The module's tree as it stands follows the layering.
func TestModuleFollowsLayering(t *testing.T) {
	pkgs, err := list("../..", nil)
	if err != nil {
		t.Fatal(err)
	}
	if v := Check(module, pkgs); len(v) > 0 {
		t.Errorf("%d imports run against the layering:\n%s", len(v), join(v))
	}
}

// A deliberately wrong import, laid over the real tree with go's -overlay
// (the files on disk are untouched), is caught: bpf/ (floor 1) reaching up
// to slices/ (floor 2), and the NIC kind importing the GPU kind beside it.
func TestWrongImportIsCaught(t *testing.T) {
	dir := t.TempDir()
	bpfDir, err := filepath.Abs("../../bpf")
	if err != nil {
		t.Fatal(err)
	}
	netdevDir, err := filepath.Abs("../../netdev")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		filepath.Join(bpfDir, "zz_wrong.go"):    "package bpf\n\nimport _ \"github.com/carve-dra/carve/slices\"\n",
		filepath.Join(netdevDir, "zz_wrong.go"): "package netdev\n\nimport _ \"github.com/carve-dra/carve/gpu\"\n",
	}
	overlay := struct{ Replace map[string]string }{Replace: map[string]string{}}
	for path, src := range files {
		f := filepath.Join(dir, filepath.Base(filepath.Dir(path))+".go")
		if err := os.WriteFile(f, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		overlay.Replace[path] = f
	}
	b, _ := json.Marshal(overlay)
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	pkgs, err := list("../..", []string{"-overlay=" + overlayFile})
	if err != nil {
		t.Fatal(err)
	}
	got := join(Check(module, pkgs))
	for _, want := range []string{
		"bpf imports slices: floor 1 (what the hardware and kernel say; BPF objects; shared test kits) reaches up to floor 2",
		"netdev imports gpu: netdev/ and gpu/ share floor 4",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("violations lack %q; got:\n%s", want, got)
		}
	}
}

// Every package must have a floor, and an import of one without a floor is
// reported rather than passed.
func TestUndeclaredPackage(t *testing.T) {
	v := Check(module, []Package{
		{ImportPath: module + "/newtop/x", Imports: []string{module + "/bpf"}},
		{ImportPath: module + "/bpf", Imports: []string{module + "/newtop/x"}},
	})
	got := join(v)
	if !strings.Contains(got, "newtop/x imports : the package has no declared floor") ||
		!strings.Contains(got, "bpf imports newtop/x: the imported package has no declared floor") {
		t.Errorf("got:\n%s", got)
	}
}

// Within one folder, a lower package may not import a higher one either:
// the plugin core does not reach into the small kinds under prepare/.
func TestSameFolderUpImport(t *testing.T) {
	v := Check(module, []Package{{ImportPath: module + "/prepare", TestImports: []string{module + "/prepare/llc"}}})
	if len(v) != 1 || !strings.Contains(v[0].Reason, "floor 3") {
		t.Errorf("got %v", v)
	}
}

func join(v []Violation) string {
	var b strings.Builder
	for _, x := range v {
		b.WriteString(x.String() + "\n")
	}
	return b.String()
}
