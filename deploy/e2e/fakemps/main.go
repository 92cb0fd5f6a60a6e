// Command fakemps stands in for nvidia-cuda-mps-control on a node without a
// GPU, for the end-to-end tests of GPU memory shares: a static binary, so
// that it runs wherever the agent runs it (its image has no shell), in the
// host's mount namespace or the agent's.
//
// With -d it starts a stand-in daemon (a copy of itself that sleeps, with
// the caller's environment, so that CUDA_MPS_PIPE_DIRECTORY is in its
// /proc environ as the real daemon's is), writes its pid file in the pipe
// directory and returns, as the real one does once it has forked. Without,
// it answers the commands on stdin only while that daemon runs:
// get_server_list (no servers), quit (ends the daemon, removes its pid
// file); every other command is accepted. The daemon ends by itself after
// two hours, so that none outlives a test by long.
package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	pipe := os.Getenv("CUDA_MPS_PIPE_DIRECTORY")
	pidFile := filepath.Join(pipe, "nvidia-cuda-mps-control.pid")
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		time.Sleep(2 * time.Hour)
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "-d" {
		self, err := os.Executable()
		if err != nil {
			fail(err)
		}
		c := exec.Command(self, "serve")
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := c.Start(); err != nil {
			fail(err)
		}
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(c.Process.Pid)+"\n"), 0o644); err != nil {
			fail(err)
		}
		return
	}
	raw, err := os.ReadFile(pidFile)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 0 || syscall.Kill(pid, 0) != nil {
		// The real binary's words, which nothing parses.
		fmt.Fprintln(os.Stderr, "Cannot find MPS control daemon process")
		os.Exit(1)
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if strings.TrimSpace(in.Text()) == "quit" {
			_ = syscall.Kill(pid, syscall.SIGTERM)
			_ = os.Remove(pidFile)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
