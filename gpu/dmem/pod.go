package dmem

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PodCgroup is the cgroup v2 directory of the pod that process pid belongs
// to: the parent of the container's cgroup, which the kubelet names after
// the pod ("kubepods-burstable-pod<uid>.slice", "pod<uid>"). The pid's
// cgroup is read from <procRoot>/<pid>/cgroup.
func PodCgroup(root, procRoot string, pid int) (string, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", fmt.Errorf("cgroup of process %d: %w", pid, err)
	}
	var path string
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			path = p
		}
	}
	if path == "" {
		return "", fmt.Errorf("process %d is in no cgroup v2 hierarchy (cgroup v1 has no dmem controller)", pid)
	}
	container := filepath.Join(root, filepath.Clean("/"+path))
	pod := filepath.Dir(container)
	if !strings.Contains(filepath.Base(pod), "pod") {
		return "", fmt.Errorf("process %d: cgroup %s is not below a pod's cgroup", pid, container)
	}
	return pod, nil
}

// RunHook is the createRuntime hook of a dmem share: it reads the OCI state
// on stdin and applies the limit to the pod's cgroup of the container's
// process, then records that cgroup in recordDir (see Record) unless it is
// empty. Every container of the pod runs it; the limit is the pod's, so
// the later runs change nothing.
func RunHook(stdin io.Reader, root, procRoot string, l Limit, recordDir string) error {
	var state struct {
		Pid int `json:"pid"`
	}
	if err := json.NewDecoder(stdin).Decode(&state); err != nil {
		return fmt.Errorf("OCI state on stdin: %w", err)
	}
	if state.Pid <= 0 {
		return errors.New("OCI state on stdin has no pid")
	}
	pod, err := PodCgroup(root, procRoot, state.Pid)
	if err != nil {
		return err
	}
	if err := Apply(root, pod, l); err != nil {
		return fmt.Errorf("pod cgroup %s: %w", pod, err)
	}
	if recordDir == "" {
		return nil
	}
	return Record(recordDir, root, pod)
}
