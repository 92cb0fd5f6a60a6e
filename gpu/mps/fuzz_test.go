package mps

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// FuzzPID reads the daemon's pid file from its pipe directory, whatever is
// there: content of any kind (SELF stands for this test's own pid, which a
// fake /proc says is the daemon's when daemonEnv is set), and in its place a
// file (kind 0), a link to one (1), a FIFO (2), a directory (3) or nothing
// (4). A pid is only ever taken for the daemon's when the file is a file,
// holds that pid, and the process carries the pipe directory in its
// environment; PID never blocks, and garbage is never alive.
func FuzzPID(f *testing.F) {
	for _, tc := range []struct {
		content   string
		kind      uint8
		daemonEnv bool
	}{
		{"SELF\n", 0, true}, {"SELF\n", 0, false}, {"SELF", 1, true}, {"", 3, true}, {"", 4, true},
		{"1\n", 0, true}, {"0\n", 0, true}, {"-1\n", 0, true}, {"-SELF\n", 0, true}, {"+SELF\n", 0, true},
		{"0SELF\n", 0, true}, {" \t\nSELF \n\n", 0, true}, {"SELF\x00\n", 0, true}, {"SELF SELF\n", 0, true},
		{"4294967297\n", 0, true}, {"9223372036854775807\n", 0, true}, {"99999999999999999999\n", 0, true},
		{"0x10\n", 0, true}, {"1e3\n", 0, true}, {strings.Repeat(" ", 62) + "SELF\n", 0, true},
		{strings.Repeat("0", 70) + "SELF\n", 0, true}, {"\xff\xfe", 0, true}, {"", 0, true},
	} {
		f.Add([]byte(tc.content), tc.kind, tc.daemonEnv)
	}
	self := strconv.Itoa(os.Getpid())
	f.Fuzz(func(t *testing.T, content []byte, kind uint8, daemonEnv bool) {
		root := t.TempDir()
		d := Daemon{Dir: filepath.Join(root, "mps"), UUID: "GPU-1", ProcRoot: filepath.Join(root, "proc")}
		if err := os.MkdirAll(d.PipeDir(), 0o755); err != nil {
			t.Fatal(err)
		}
		env := "PATH=/bin\x00CUDA_MPS_PIPE_DIRECTORY=" + d.PipeDir() + "-not\x00"
		if daemonEnv {
			env += "CUDA_MPS_PIPE_DIRECTORY=" + d.PipeDir() + "\x00"
		}
		if err := os.MkdirAll(filepath.Join(d.ProcRoot, self), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d.ProcRoot, self, "environ"), []byte(env), 0o644); err != nil {
			t.Fatal(err)
		}
		content = []byte(strings.ReplaceAll(string(content), "SELF", self))
		path := filepath.Join(d.PipeDir(), pidFile)
		var err error
		switch kind % 5 {
		case 0:
			err = os.WriteFile(path, content, 0o644)
		case 1:
			target := filepath.Join(root, "elsewhere")
			if err = os.WriteFile(target, content, 0o644); err == nil {
				err = os.Symlink(target, path)
			}
		case 2:
			err = syscall.Mkfifo(path, 0o644)
		case 3:
			err = os.Mkdir(path, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}

		type result struct {
			pid   int
			alive bool
		}
		done := make(chan result, 1)
		go func() {
			pid, alive := d.PID()
			done <- result{pid, alive}
		}()
		var r result
		select {
		case r = <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("PID blocked on a pid file of kind %d", kind%5)
		}
		if r.pid < 0 || (!r.alive && r.pid != 0 && kind%5 != 0) {
			t.Fatalf("PID = %d, %v from a pid file of kind %d", r.pid, r.alive, kind%5)
		}
		if !r.alive {
			return
		}
		if kind%5 != 0 || !daemonEnv || strconv.Itoa(r.pid) != self {
			t.Fatalf("PID = %d, alive, from %q (kind %d, daemon environment %v)", r.pid, content, kind%5, daemonEnv)
		}
		// Alive: the file's first bytes, trimmed, are a decimal pid.
		head := content
		if len(head) > 64 {
			head = head[:64]
		}
		if n, err := strconv.Atoi(strings.TrimSpace(string(head))); err != nil || n != r.pid {
			t.Fatalf("PID = %d, alive, from %q", r.pid, content)
		}
	})
}
