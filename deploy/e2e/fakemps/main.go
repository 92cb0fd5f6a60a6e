// Command fakemps stands in for nvidia-cuda-mps-control on a node without a
// GPU, for the end-to-end tests of GPU memory shares: a static binary, so
// that it runs wherever the agent runs it (its image has no shell), in the
// host's mount namespace or the agent's.
//
// With -d it starts a stand-in daemon (a copy of itself, with the caller's
// environment, so that CUDA_MPS_PIPE_DIRECTORY is in its /proc environ as
// the real daemon's is), writes its pid file in the pipe directory and
// returns, as the real one does once it has forked. Without, it answers the
// commands on stdin only while that daemon runs: get_server_list (no
// servers), quit (ends the daemon, removes its pid file); every other
// command is accepted. The daemon ends by itself after two hours, so that
// none outlives a test by long.
//
// The daemon serves its clients as the real one does for what a pod's
// permissions decide (strace of driver 580's, bottlerocket-os/bottlerocket
// #4673): it listens on <pipe>/control and keeps a FIFO <pipe>/log; for a
// client of another UID than root it forks a server that setuids to that
// UID and then opens <pipe>/log and connects to <pipe>/control by the
// daemon's own (host) path. A server that cannot reach them exits, and the
// client is told its MPS server failed. `fakemps client` is such a client:
// in a container it connects to $CUDA_MPS_PIPE_DIRECTORY/control and exits
// 0 only where its server started.
package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	pipe := os.Getenv("CUDA_MPS_PIPE_DIRECTORY")
	pidFile := filepath.Join(pipe, "nvidia-cuda-mps-control.pid")
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "serve":
			serve(pipe)
			return
		case "server":
			server(pipe)
			return
		case "client":
			client(pipe)
			return
		}
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

// serve is the daemon: the control socket and the log FIFO in the pipe
// directory, a server per client UID, for two hours at most.
func serve(pipe string) {
	control, logFIFO := filepath.Join(pipe, "control"), filepath.Join(pipe, "log")
	_ = os.Remove(control)
	_ = os.Remove(logFIFO)
	if err := unix.Mkfifo(logFIFO, 0o666); err != nil {
		fail(err)
	}
	// Clients and servers of any UID write there and connect here.
	_ = os.Chmod(logFIFO, 0o666)
	// Held open for reading, so that a server's open for writing finds a
	// reader.
	reader, err := os.OpenFile(logFIFO, os.O_RDWR, 0)
	if err != nil {
		fail(err)
	}
	defer func() { _ = reader.Close() }()
	l, err := net.Listen("unix", control)
	if err != nil {
		fail(err)
	}
	_ = os.Chmod(control, 0o666)
	go func() {
		time.Sleep(2 * time.Hour)
		os.Exit(0)
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go answer(c.(*net.UnixConn), pipe)
	}
}

// answer serves one connection: a client asking for its server ("start"),
// or a server checking in ("server").
func answer(c *net.UnixConn, pipe string) {
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return
	}
	if strings.TrimSpace(line) != "start" {
		fmt.Fprintln(c, "hello")
		return
	}
	raw, err := c.SyscallConn()
	if err != nil {
		fmt.Fprintln(c, "MPS client failed:", err)
		return
	}
	var cred *unix.Ucred
	var credErr error
	_ = raw.Control(func(fd uintptr) { cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if credErr != nil {
		fmt.Fprintln(c, "MPS client failed:", credErr)
		return
	}
	if err := startServer(pipe, cred.Uid, cred.Gid); err != nil {
		fmt.Fprintf(c, "MPS client failed: the server for uid %d: %v\n", cred.Uid, err)
		return
	}
	fmt.Fprintln(c, "ok")
}

// startServer runs a server as uid:gid, as the real daemon forks one,
// setuids and execs nvidia-cuda-mps-server, and waits for it to check in.
func startServer(pipe string, uid, gid uint32) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "server")
	cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=" + pipe}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// server is the MPS server's first steps: the log FIFO and the control
// socket, each by the daemon's path.
func server(pipe string) {
	f, err := os.OpenFile(filepath.Join(pipe, "log"), os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		fail(err)
	}
	_ = f.Close()
	c, err := net.Dial("unix", filepath.Join(pipe, "control")) //nolint:gosec // G704: the daemon's own socket, named by the daemon's environment
	if err != nil {
		fail(err)
	}
	defer func() { _ = c.Close() }()
	fmt.Fprintln(c, "server")
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		fail(err)
	}
}

// client asks the daemon of $CUDA_MPS_PIPE_DIRECTORY for its server, as a
// CUDA process's first call does, and exits 0 only where it got one.
func client(pipe string) {
	c, err := net.Dial("unix", filepath.Join(pipe, "control")) //nolint:gosec // G704: the claim's daemon, named by the container's environment
	if err != nil {
		fail(err)
	}
	defer func() { _ = c.Close() }()
	fmt.Fprintln(c, "start")
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fail(err)
	}
	reply = strings.TrimSpace(reply)
	fmt.Printf("uid %d: %s\n", os.Getuid(), reply)
	if reply != "ok" {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
