package hook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ContainerPID reads the container's pid from the OCI state a runtime hook
// gets on stdin (runtime-spec's State).
func ContainerPID(stdin io.Reader) (int, error) {
	state, err := readState(stdin)
	if err != nil {
		return 0, err
	}
	return state.Pid, nil
}

// maxStateBytes bounds the OCI state a hook reads: the state is a few
// fields and the container's annotations, which Kubernetes caps at 256 KiB.
const maxStateBytes = 4 << 20

func readState(stdin io.Reader) (specs.State, error) {
	var state specs.State
	// The whole of stdin is the state: one JSON document and nothing
	// after it (a decoder would stop at the first value and let the
	// rest pass unread).
	b, err := io.ReadAll(io.LimitReader(stdin, maxStateBytes+1))
	if err != nil {
		return state, fmt.Errorf("OCI state on stdin: %w", err)
	}
	if len(b) > maxStateBytes {
		return state, fmt.Errorf("OCI state on stdin: over %d bytes", maxStateBytes)
	}
	if err := json.Unmarshal(b, &state); err != nil {
		return specs.State{}, fmt.Errorf("OCI state on stdin: %w", err)
	}
	if state.Pid <= 0 {
		return state, fmt.Errorf("OCI state on stdin has no pid (container %q, status %q)", state.ID, state.Status)
	}
	return state, nil
}

// BundleNetns is the network namespace path the container's bundle names
// (config.json's linux.namespaces): the pod sandbox's, which the runtime
// joins the container to. "" where the bundle names none (the container
// would get a new namespace, or the bundle cannot be read under root).
func BundleNetns(root, bundle string) (string, error) {
	if bundle == "" || !filepath.IsAbs(bundle) {
		return "", nil
	}
	b, err := os.ReadFile(filepath.Join(root, bundle, "config.json"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("the container's bundle: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return "", fmt.Errorf("the container's bundle %s: %w", bundle, err)
	}
	if spec.Linux == nil {
		return "", nil
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns.Path, nil
		}
	}
	return "", nil
}

// netAdminCaps are the capabilities that let a process reshape its pod's
// network: its interfaces' MACs and addresses, links nested on them
// (a macvlan on the share lands on the node's NIC), its qdiscs and BPF.
var netAdminCaps = []string{"CAP_NET_ADMIN", "CAP_SYS_ADMIN"}

// BundleNetAdmin is the first of netAdminCaps the container's bundle
// (config.json's process.capabilities, any set: bounding, effective,
// permitted, inheritable or ambient) gives its process, "" where none. A
// bundle that cannot be read is an error: without it nothing says what
// the container may do.
func BundleNetAdmin(root, bundle string) (string, error) {
	if bundle == "" || !filepath.IsAbs(bundle) {
		return "", fmt.Errorf("the OCI state names no bundle (%q): cannot tell the container's capabilities", bundle)
	}
	b, err := os.ReadFile(filepath.Join(root, bundle, "config.json"))
	if err != nil {
		return "", fmt.Errorf("the container's bundle, for its capabilities: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return "", fmt.Errorf("the container's bundle %s: %w", bundle, err)
	}
	if spec.Process == nil || spec.Process.Capabilities == nil {
		// runc drops no capability where the bundle lists none.
		return "CAP_NET_ADMIN", nil
	}
	c := spec.Process.Capabilities
	for _, set := range [][]string{c.Bounding, c.Effective, c.Permitted, c.Inheritable, c.Ambient} {
		for _, capName := range set {
			if slices.Contains(netAdminCaps, strings.ToUpper(capName)) {
				return strings.ToUpper(capName), nil
			}
		}
	}
	return "", nil
}
