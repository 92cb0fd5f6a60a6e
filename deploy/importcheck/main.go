// Command importcheck fails when an import of carve's module runs against
// its declared layering (layers.go): a package imports only packages on
// lower floors, or of its own top-level folder on its own floor. `make
// verify` runs it; the test proves it catches a wrong import.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
)

// module is carve's module path.
const module = "github.com/carve-dra/carve"

func main() {
	args := os.Args[1:]
	pkgs, err := list(".", args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "importcheck:", err)
		os.Exit(2)
	}
	v := Check(module, pkgs)
	for _, x := range v {
		fmt.Fprintln(os.Stderr, x)
	}
	if len(v) > 0 {
		fmt.Fprintf(os.Stderr, "importcheck: %d imports run against the layering (deploy/importcheck/layers.go)\n", len(v))
		os.Exit(1)
	}
}

// list runs `go list` over the module in dir; extra arguments (such as an
// -overlay) go before the pattern.
func list(dir string, extra []string) ([]Package, error) {
	args := append([]string{"list", "-e", "-json=ImportPath,Imports,TestImports,XTestImports,Error"}, extra...)
	cmd := exec.Command("go", append(args, "./...")...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w: %s", err, stderr.String())
	}
	var pkgs []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			Package
			Error *struct{ Err string }
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("decoding go list: %w", err)
		}
		if p.Error != nil {
			return nil, fmt.Errorf("%s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p.Package)
	}
	return pkgs, nil
}
