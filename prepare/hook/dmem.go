package hook

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/carve-dra/carve/discovery/proccgroup"
	"github.com/carve-dra/carve/prepare/atomicfile"
)

// DefaultCgroupRoot is where cgroup v2 is mounted.
const DefaultCgroupRoot = "/sys/fs/cgroup"

// PodCgroup is the cgroup v2 directory of the pod that process pid belongs
// to: the parent of the container's cgroup, which the kubelet names after
// the pod ("kubepods-burstable-pod<uid>.slice", "pod<uid>"). The pid's
// cgroup is read from <procRoot>/<pid>/cgroup.
func PodCgroup(root, procRoot string, pid int) (string, error) {
	entries, err := proccgroup.Read(procRoot, pid)
	if err != nil {
		return "", err
	}
	path := proccgroup.Unified(entries)
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

// RunDmemLimit is the createRuntime hook of a dmem share: it reads the OCI state
// on stdin and applies the limit to the pod's cgroup of the container's
// process, then records that cgroup in recordDir (see RecordPodCgroup) unless it is
// empty. Every container of the pod runs it; the limit is the pod's, so
// the later runs change nothing.
func RunDmemLimit(stdin io.Reader, root, procRoot string, l DmemLimit, recordDir string) error {
	pid, err := ContainerPID(stdin)
	if err != nil {
		return err
	}
	pod, err := PodCgroup(root, procRoot, pid)
	if err != nil {
		return err
	}
	if err := ApplyDmem(root, pod, l); err != nil {
		return fmt.Errorf("pod cgroup %s: %w", pod, err)
	}
	if recordDir == "" {
		return nil
	}
	return RecordPodCgroup(recordDir, root, pod)
}

// DmemLimit is what a share's pod may hold of one region.
type DmemLimit struct {
	Region string
	// Max is the hard limit (dmem.max); allocations past it fail.
	Max uint64
	// Min is the guarantee (dmem.min); 0 leaves dmem.min alone.
	Min uint64
}

func (l DmemLimit) validate() error {
	if l.Region == "" || strings.ContainsAny(l.Region, " \n\t") {
		return fmt.Errorf("dmem region %q is not a region name", l.Region)
	}
	if l.Max == 0 {
		return errors.New("dmem limit of 0 bytes")
	}
	if l.Min > l.Max {
		return fmt.Errorf("dmem guarantee %d exceeds the limit %d", l.Min, l.Max)
	}
	return nil
}

// ApplyDmem writes the limit to the cgroup at dir (a path below root), first
// enabling the dmem controller in cgroup.subtree_control of every ancestor
// from root down to dir's parent, which is what makes dir's dmem files
// exist. Writing the same limit again changes nothing.
func ApplyDmem(root, dir string, l DmemLimit) error {
	if err := l.validate(); err != nil {
		return err
	}
	rel, err := filepath.Rel(root, dir)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("cgroup %s is not below the cgroup root %s", dir, root)
	}
	cur := root
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		if err := enableDmem(cur); err != nil {
			return err
		}
		cur = filepath.Join(cur, part)
	}
	if err := writeLine(filepath.Join(dir, "dmem.max"), fmt.Sprintf("%s %d", l.Region, l.Max)); err != nil {
		return err
	}
	if l.Min > 0 {
		return writeLine(filepath.Join(dir, "dmem.min"), fmt.Sprintf("%s %d", l.Region, l.Min))
	}
	return nil
}

// enableDmem adds dmem to a cgroup's subtree_control unless it is there.
func enableDmem(dir string) error {
	ctl := filepath.Join(dir, "cgroup.subtree_control")
	b, err := os.ReadFile(ctl)
	if err != nil {
		return fmt.Errorf("enable dmem below cgroup %s: %w", dir, err)
	}
	for _, c := range strings.Fields(string(b)) {
		if c == "dmem" {
			return nil
		}
	}
	if err := writeLine(ctl, "+dmem"); err != nil {
		return fmt.Errorf("enable dmem below cgroup %s: %w", dir, err)
	}
	return nil
}

// writeLine writes one control line, as a single write, to a cgroup file.
func writeLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", line, path, err)
	}
	_, werr := f.WriteString(line + "\n")
	cerr := f.Close()
	if werr != nil {
		return fmt.Errorf("write %q to %s: %w", line, path, werr)
	}
	return cerr
}

// RecordPodCgroup notes in dir, one file per pod, the pod cgroup (below root) that a
// share's hook limited, so that the limit can be checked later (`carve
// shares`). Every container of the pod writes the same file, whole.
func RecordPodCgroup(dir, root, pod string) error {
	rel, err := filepath.Rel(root, pod)
	if err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("record pod cgroup %s: not below %s", pod, root)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("record pod cgroup %s: %w", pod, err)
	}
	return atomicfile.Write(filepath.Join(dir, filepath.Base(pod)), []byte(rel+"\n"), 0o644)
}

// RecordedPodCgroups lists the pod cgroups recorded in dir, as paths below root. No
// directory: no container of the share has started.
func RecordedPodCgroups(dir, root string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, filepath.Join(root, filepath.Clean("/"+strings.TrimSpace(string(b)))))
	}
	return out, nil
}

// ReadDmem returns a region's value in a dmem.max or dmem.min file: its bytes,
// or "max".
func ReadDmem(path, region string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == region {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("%s has no line for region %s", path, region)
}
