package police

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/carve-dra/carve/discovery/proccgroup"
)

// writeProc writes one file of process pid under a fresh /proc.
func writeProc(t *testing.T, pid int, name string, content []byte) string {
	t.Helper()
	proc := t.TempDir()
	dir := filepath.Join(proc, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), content, 0o644); err != nil {
		t.Fatal(err)
	}
	return proc
}

// FuzzStartTime reads /proc/<pid>/stat of any content. A start time read
// is one of the file's numbers; a file that is there but unreadable as a
// stat is an error that names it, never "process gone" (ESRCH), which would
// make the police take a live process for one that ended.
func FuzzStartTime(f *testing.F) {
	for _, s := range []string{
		"42 (python3 (x)) S 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 123456 0 0\n",
		"42 (a) b) S 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 18446744073709551615 0 0\n",
		"42 (a) S 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 18446744073709551616 0\n",
		"42 (a) S 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 -5 0\n",
		"42 (a) S 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 +5 0\n",
		"42 (a) S 1 1 1\n", "42 (a S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 7 0\n",
		"42 (\n) S\t1\v1\f1\r0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 7\n", ")", "", "\x00\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		const pid = 42
		proc := writeProc(t, pid, "stat", content)
		v, err := startTime(proc, pid)
		if err != nil {
			if errors.Is(err, syscall.ESRCH) {
				t.Fatalf("a stat file that is there (%q) read as a process gone: %v", content, err)
			}
			if !strings.Contains(err.Error(), filepath.Join(proc, "42", "stat")) {
				t.Fatalf("the error does not name the file: %v", err)
			}
			if StartTime(proc, pid) != 0 {
				t.Fatal("StartTime of an unreadable stat is not 0")
			}
			return
		}
		if StartTime(proc, pid) != v {
			t.Fatalf("StartTime and startTime disagree on %q", content)
		}
		s := string(content)
		tail := s[strings.LastIndexByte(s, ')')+1:]
		found := false
		for _, field := range strings.Fields(tail) {
			if n, err := strconv.ParseUint(field, 10, 64); err == nil && n == v {
				found = true
			}
		}
		if !found {
			t.Fatalf("start time %d is none of the numbers after the command name in %q", v, content)
		}
	})
}

// FuzzStartTimeComm is the stat line as the kernel writes it, with a
// command name the process chose (prctl PR_SET_NAME, comm: up to 15 bytes,
// any but NUL, written unescaped): spaces, parentheses and numbers in it
// never move the start time read.
func FuzzStartTimeComm(f *testing.F) {
	for _, tc := range []struct {
		comm  string
		state byte
		start uint64
		other int64
	}{
		{"python3", 'S', 123456, 0},
		{"x) R 1 2 3 4 5", 'R', 1, -1},
		{") ) ) ) ) ) ) )", 'Z', 0, 1 << 40},
		{"a\nb\tc", 'D', 18446744073709551615, -9223372036854775808},
		{"(((", 'I', 99, 4194560},
		{"", 'X', 7, 20},
	} {
		f.Add(tc.comm, tc.state, tc.start, tc.other)
	}
	f.Fuzz(func(t *testing.T, comm string, state byte, start uint64, other int64) {
		comm = strings.ReplaceAll(comm, "\x00", "")
		if len(comm) > 15 {
			comm = comm[:15]
		}
		if state <= ' ' || state == ')' || state > '~' {
			state = 'S'
		}
		// Fields 3 to 52 (Linux 3.5 and later); 22 is the start time.
		fields := []string{string(state)}
		for i := 4; i <= 52; i++ {
			switch i {
			case 22:
				fields = append(fields, strconv.FormatUint(start, 10))
			case 7, 8: // tty_nr, tpgid: may be negative
				fields = append(fields, strconv.FormatInt(other, 10))
			default:
				fields = append(fields, strconv.FormatUint(uint64(other)>>uint(i%64), 10))
			}
		}
		const pid = 4242
		line := fmt.Sprintf("%d (%s) %s\n", pid, comm, strings.Join(fields, " "))
		proc := writeProc(t, pid, "stat", []byte(line))
		if v, err := startTime(proc, pid); err != nil || v != start {
			t.Fatalf("startTime of %q = %d, %v; want %d", line, v, err, start)
		}
	})
}

// uidIn is a pod UID written either way the kubelet writes it.
var uidIn = regexp.MustCompile(`pod[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// FuzzPodOf maps a process to its pod from /proc/<pid>/cgroup of any
// content. The paths' last parts are the tenant's where a container may
// make cgroups (a delegated cgroup v2 subtree): a name such as
// "pod<another pod's UID>" below its own pod's cgroup must never make the
// police take its process for another pod's. The pod is the first pod UID
// of the first line that has one; it is in the file; a file without one is
// an error.
func FuzzPodOf(f *testing.F) {
	const a, b = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002"
	sd := func(u string) string { return strings.ReplaceAll(u, "-", "_") }
	for _, s := range []string{
		"12:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + sd(a) + ".slice/cri-containerd-1.scope\n0::/\n",
		"0::/kubepods/burstable/pod" + a + "/ctr/pod" + b + "\n",
		"0::/kubepods/burstable/pod" + a + "/ctr/x\n0::/kubepods/pod" + b + "\n",
		"0::/kubepods/burstable/pod" + a[:8] + "_" + a[9:] + "\n",
		"0::/kubepods/burstable/podAAAAAAAA-0000-0000-0000-000000000001\n",
		"0::/init.scope\n", "0::/kubepods/pod" + a[:30] + "\n", "garbage\n0::/kubepods/pod" + a + "\n", "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		const pid = 77
		proc := writeProc(t, pid, "cgroup", content)
		uid, err := PodOf(proc, pid)
		entries, perr := proccgroup.Parse(string(content))
		if err != nil {
			if uid != "" || !strings.Contains(err.Error(), "cgroup") {
				t.Fatalf("PodOf = %q, %v", uid, err)
			}
			if perr == nil {
				for _, e := range entries {
					if uidIn.MatchString(strings.ReplaceAll(e.Path, "_", "-")) {
						t.Fatalf("no pod found in %q, which names one", content)
					}
				}
			}
			return
		}
		if perr != nil {
			t.Fatalf("a pod %s from a file that does not parse: %v", uid, perr)
		}
		if !uidIn.MatchString("pod"+string(uid)) || len(uid) != 36 {
			t.Fatalf("PodOf = %q, not a pod UID", uid)
		}
		for _, e := range entries {
			m := uidIn.FindString(strings.ReplaceAll(e.Path, "_", "-"))
			if m == "" {
				continue
			}
			if m != "pod"+string(uid) {
				t.Fatalf("PodOf(%q) = %s; the first pod named is %s", content, uid, m[3:])
			}
			return
		}
		t.Fatalf("PodOf(%q) = %s, which the file does not name", content, uid)
	})
}
