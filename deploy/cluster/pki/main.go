// Command pki makes the local test cluster's certificates, keys and
// kubeconfigs (deploy/cluster/pki.sh runs it; up.sh and node.sh call
// pki.sh's functions). One subcommand per kind of file:
//
//	pki ca          --dir DIR --name NAME --cn CN
//	pki issue       --dir DIR --ca CA --name NAME --subject /O=ORG/CN=NAME --usage client|server [--san IP:A,DNS:B]
//	pki signing-key --dir DIR --name NAME
//	pki kubeconfig  --out FILE --server URL --ca-file CA.crt --user USER --cert CRT --key KEY
//
// It imports nothing from the rest of this module: deploy/gotool.sh caches
// the built binary keyed on this directory, go.mod and go.sum alone.
package main

import (
	"fmt"
	"os"
)

func main() {
	err := dispatch(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "[pki] ERROR: %v\n", err)
		os.Exit(1)
	}
}
