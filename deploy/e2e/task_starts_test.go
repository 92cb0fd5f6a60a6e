package e2e

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// taskStarts follows the node's containerd events and keeps when each task
// started (the /tasks/start event's own timestamp, in nanoseconds): a pod's
// start up to its container running, without the kubelet's status report
// and the API server's write that Ready waits for besides (30-50 ms a pod
// here), which no driver moves.
type taskStarts struct {
	env map[string]string
	mu  sync.Mutex
	at  map[string]time.Time // container ID -> start
}

func watchTaskStarts(b testing.TB, env map[string]string) *taskStarts {
	b.Helper()
	s := &taskStarts{env: env, at: map[string]time.Time{}}
	ctr := filepath.Join(env["CARVE_CONTAINERD_BIN_DIR"], "ctr")
	cmd := exec.Command(ctr, "--address", env["CARVE_CONTAINERD_ADDRESS"], "events")
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("ctr events: %v", err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if id, at, ok := parseTaskStart(sc.Text()); ok {
				s.mu.Lock()
				s.at[id] = at
				s.mu.Unlock()
			}
		}
	}()
	return s
}

// parseTaskStart reads a line of `ctr events` ("<time> <namespace>
// <topic> <event JSON>", the time as Go prints a time.Time) if it is a
// task's start.
func parseTaskStart(line string) (string, time.Time, bool) {
	f := strings.SplitN(line, " ", 7)
	if len(f) != 7 || f[5] != "/tasks/start" {
		return "", time.Time{}, false
	}
	at, err := time.Parse("2006-01-02 15:04:05.999999999 -0700 MST", strings.Join(f[:4], " "))
	if err != nil {
		return "", time.Time{}, false
	}
	var ev struct {
		ContainerID string `json:"container_id"`
	}
	if json.Unmarshal([]byte(f[6]), &ev) != nil || ev.ContainerID == "" {
		return "", time.Time{}, false
	}
	return ev.ContainerID, at, true
}

// of is when the task of pod's container started, waiting up to 5 s for
// its event.
func (s *taskStarts) of(b testing.TB, pod, container string) time.Time {
	b.Helper()
	ctr := filepath.Join(s.env["CARVE_CONTAINERD_BIN_DIR"], "ctr")
	ids := strings.Fields(run(b, ctr, "--address", s.env["CARVE_CONTAINERD_ADDRESS"], "-n", "k8s.io", "containers", "ls", "-q",
		`labels."io.kubernetes.pod.name"==`+pod+`,labels."io.kubernetes.pod.namespace"==`+testNS+`,labels."io.kubernetes.container.name"==`+container))
	if len(ids) != 1 {
		b.Fatalf("containers %s of pod %s: %q", container, pod, ids)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		at, ok := s.at[ids[0]]
		s.mu.Unlock()
		if ok {
			return at
		}
		if time.Now().After(deadline) {
			b.Fatalf("no /tasks/start event for container %s of pod %s", ids[0], pod)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestParseTaskStart(t *testing.T) {
	id, at, ok := parseTaskStart(`2026-11-30 00:20:01.123456789 +0000 UTC k8s.io /tasks/start {"container_id":"abc","pid":42}`)
	if !ok || id != "abc" || at.Nanosecond() != 123456789 {
		t.Errorf("parseTaskStart = %q, %v, %v", id, at, ok)
	}
	if _, _, ok := parseTaskStart(`2026-11-30 00:20:01.1 +0000 UTC k8s.io /tasks/create {"container_id":"abc"}`); ok {
		t.Error("a create event read as a start")
	}
}
