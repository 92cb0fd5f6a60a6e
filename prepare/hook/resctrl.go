package hook

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// AddResctrlTask moves a container's process (and the threads it creates
// from then on) into an LLC share's resctrl group under dir, where resctrl
// is mounted. Writing a task that is already there changes nothing. The
// kernel says why it refused a write in info/last_cmd_status, which the
// error quotes.
func AddResctrlTask(dir, group string, pid int) error {
	if group == "" || strings.Contains(group, "/") || group == "." || group == ".." {
		return fmt.Errorf("resctrl group %q is not a group name", group)
	}
	err := writeTask(filepath.Join(dir, group, "tasks"), pid)
	if err == nil {
		return nil
	}
	if b, rerr := os.ReadFile(filepath.Join(dir, "info", "last_cmd_status")); rerr == nil {
		if s := strings.TrimSpace(string(b)); s != "" && s != "ok" {
			return fmt.Errorf("move pid %d into resctrl group %q: %w (resctrl: %s)", pid, group, err, s)
		}
	}
	return fmt.Errorf("move pid %d into resctrl group %q: %w", pid, group, err)
}

// writeTask writes the pid in one write to an existing tasks file (a group
// that is gone is an error, not a new file).
func writeTask(path string, pid int) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(strconv.Itoa(pid))
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	return werr
}
