// Command carve-hook is the container runtime hook that carve's CDI specs
// run (see package prepare/hook). It is a small static binary (built with
// CGO_ENABLED=0) because it runs on the host, outside carve's image: it must
// not depend on the host's C library, and it starts once per container.
package main

import (
	"os"

	"github.com/carve-dra/carve/prepare/hook"
)

func main() {
	os.Exit(hook.Main(os.Args[1:], os.Stdin, os.Stderr))
}
