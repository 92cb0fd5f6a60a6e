// Command ocibuild builds a single-layer OCI image archive from files on this
// host, with no registry, no Docker and no base image: the local test cluster
// (deploy/cluster) cannot pull, so every image it runs is made this way and
// imported with deploy/images/import.sh. deploy/images/build.sh runs it and
// documents the command line; this file only wires it to the process.
//
// It imports nothing from the rest of this module: deploy/gotool.sh caches
// the built binary keyed on this directory, go.mod and go.sum alone.
package main

import (
	"fmt"
	"os"
)

func main() {
	opts, err := parseArgs(os.Args[1:])
	if err == nil {
		err = run(opts, os.Stdout, os.Stderr)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "[image-build] ERROR: %v\n", err)
		os.Exit(1)
	}
}
