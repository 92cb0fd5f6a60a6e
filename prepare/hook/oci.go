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

// ContainerBundle is what the hook reads of a container's bundle
// (config.json): its network namespace and its capabilities, nothing else.
// It is read and decoded once a hook run, into those fields only: a
// restricted pod's config.json is about 10 KB, most of it the seccomp
// profile, and decoding the whole runtime-spec twice took 0.68 ms a run
// warm, more in the hook's fresh process (the two fields alone: 0.11 ms).
type ContainerBundle struct {
	path  string // the bundle's path as the OCI state names it
	found bool   // config.json was there
	cfg   bundleConfig
}

type bundleConfig struct {
	Process *struct {
		Capabilities *specs.LinuxCapabilities `json:"capabilities,omitempty"`
	} `json:"process,omitempty"`
	Linux *struct {
		Namespaces []specs.LinuxNamespace `json:"namespaces,omitempty"`
	} `json:"linux,omitempty"`
}

// ReadBundle reads the config.json of the bundle the OCI state names,
// under a host root (/ or /host). A bundle that is not named, not absolute
// or not there is found empty (its Netns is "", and NetAdmin refuses it); a
// config.json that cannot be read or decoded is an error naming the bundle.
func ReadBundle(root, bundle string) (ContainerBundle, error) {
	b := ContainerBundle{path: bundle}
	if bundle == "" || !filepath.IsAbs(bundle) {
		return b, nil
	}
	raw, err := os.ReadFile(filepath.Join(root, bundle, "config.json"))
	if errors.Is(err, os.ErrNotExist) {
		return b, nil
	}
	if err != nil {
		return b, fmt.Errorf("the container's bundle: %w", err)
	}
	if err := json.Unmarshal(raw, &b.cfg); err != nil {
		return b, fmt.Errorf("the container's bundle %s: %w", bundle, err)
	}
	b.found = true
	return b, nil
}

// Netns is the network namespace path the bundle names (config.json's
// linux.namespaces): the pod sandbox's, which the runtime joins the
// container to. "" where the bundle names none (the container would get a
// new namespace, or the bundle cannot be read under root).
func (b ContainerBundle) Netns() string {
	if b.cfg.Linux == nil {
		return ""
	}
	for _, ns := range b.cfg.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns.Path
		}
	}
	return ""
}

// netAdminCaps are the capabilities that let a process reshape its pod's
// network: its interfaces' MACs and addresses, links nested on them
// (a macvlan on the share lands on the node's NIC), its qdiscs and BPF.
var netAdminCaps = []string{"CAP_NET_ADMIN", "CAP_SYS_ADMIN"}

// NetAdmin is the first of netAdminCaps the bundle (config.json's
// process.capabilities, any set: bounding, effective, permitted,
// inheritable or ambient) gives the container's process, "" where none. A
// bundle that could not be read is an error: without it nothing says what
// the container may do.
func (b ContainerBundle) NetAdmin() (string, error) {
	if b.path == "" || !filepath.IsAbs(b.path) {
		return "", fmt.Errorf("the OCI state names no bundle (%q): cannot tell the container's capabilities", b.path)
	}
	if !b.found {
		return "", fmt.Errorf("the container's bundle %s, for its capabilities: no config.json", b.path)
	}
	if b.cfg.Process == nil || b.cfg.Process.Capabilities == nil {
		// runc drops no capability where the bundle lists none.
		return "CAP_NET_ADMIN", nil
	}
	c := b.cfg.Process.Capabilities
	for _, set := range [][]string{c.Bounding, c.Effective, c.Permitted, c.Inheritable, c.Ambient} {
		for _, capName := range set {
			if slices.Contains(netAdminCaps, strings.ToUpper(capName)) {
				return strings.ToUpper(capName), nil
			}
		}
	}
	return "", nil
}
