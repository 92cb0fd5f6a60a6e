package hook

import (
	"encoding/json"
	"fmt"
	"io"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ContainerPID reads the container's pid from the OCI state a runtime hook
// gets on stdin (runtime-spec's State).
func ContainerPID(stdin io.Reader) (int, error) {
	var state specs.State
	if err := json.NewDecoder(stdin).Decode(&state); err != nil {
		return 0, fmt.Errorf("OCI state on stdin: %w", err)
	}
	if state.Pid <= 0 {
		return 0, fmt.Errorf("OCI state on stdin has no pid (container %q, status %q)", state.ID, state.Status)
	}
	return state.Pid, nil
}
