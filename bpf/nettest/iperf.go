package nettest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"time"
)

// UDPResult is one iperf3 UDP flow's outcome over the measured window.
type UDPResult struct {
	// Offered is what the sender put on the wire, Received what the
	// receiver got, both in bits/s of UDP payload.
	Offered, Received float64
	// LostPercent is iperf3's count of datagrams that never arrived.
	LostPercent float64
	// Duration is the wall time between the two marks.
	Duration time.Duration
}

// RunIperfUDP runs one iperf3 UDP flow per flow at once, each offering
// rates[i] bits/s in datagrams of size bytes, for d after warmup (iperf3's
// --omit: the warm-up is not in its sums). iperf3 is a C sender that can
// offer line rate on a core where a Go loop cannot. mark, when not nil, is
// called as the measured window opens and closes.
func RunIperfUDP(flows []Flow, size int, rates []float64, warmup, d time.Duration, mark func()) ([]UDPResult, error) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		return nil, fmt.Errorf("iperf3 is not installed: %w", err)
	}
	var servers []*exec.Cmd
	defer func() {
		for _, s := range servers {
			_ = s.Process.Kill()
			_ = s.Wait()
		}
	}()
	for _, f := range flows {
		_, port, err := net.SplitHostPort(f.ToAddr)
		if err != nil {
			return nil, err
		}
		srv := exec.Command("iperf3", "-s", "-1", "-p", port)
		// Started from a thread in the receiver's namespace, so the
		// child is born there.
		if err := In(f.To, srv.Start); err != nil {
			return nil, fmt.Errorf("iperf3 server: %w", err)
		}
		servers = append(servers, srv)
	}
	secs := func(t time.Duration) string { return strconv.FormatFloat(t.Seconds(), 'f', 1, 64) }
	out := make([]UDPResult, len(flows))
	errs := make([]error, len(flows))
	var wg sync.WaitGroup
	var window struct {
		sync.Mutex
		start, end time.Time
	}
	for i, f := range flows {
		host, port, _ := net.SplitHostPort(f.ToAddr)
		if err := waitListening(f); err != nil {
			return nil, err
		}
		var stdout, stderr bytes.Buffer
		cli := exec.Command("iperf3", "-c", host, "-p", port, "-u", "-b", strconv.FormatFloat(math.Round(rates[i]), 'f', 0, 64),
			"-l", strconv.Itoa(size), "-t", secs(d+warmup), "-O", secs(warmup), "--json")
		cli.Stdout, cli.Stderr = &stdout, &stderr
		if err := In(f.From, cli.Start); err != nil {
			return nil, fmt.Errorf("iperf3 client: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cli.Wait(); err != nil {
				errs[i] = fmt.Errorf("iperf3 to %s: %v: %s%s", f.ToAddr, err, stderr.String(), stdout.String())
				return
			}
			out[i], errs[i] = parseIperfUDP(stdout.Bytes())
		}()
	}
	go func() {
		time.Sleep(warmup)
		window.Lock()
		window.start = time.Now()
		window.Unlock()
		if mark != nil {
			mark()
		}
		time.Sleep(d)
		window.Lock()
		window.end = time.Now()
		window.Unlock()
		if mark != nil {
			mark()
		}
	}()
	wg.Wait()
	// The marks' goroutine ends within d+warmup, as the clients do.
	for {
		window.Lock()
		done := !window.end.IsZero()
		window.Unlock()
		if done {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range out {
		if errs[i] != nil {
			return nil, errs[i]
		}
		out[i].Duration = window.end.Sub(window.start)
	}
	return out, nil
}

// parseIperfUDP reads an iperf3 client's --json report.
func parseIperfUDP(raw []byte) (UDPResult, error) {
	var rep struct {
		Error string `json:"error"`
		End   struct {
			Sent struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_sent"`
			Received struct {
				BitsPerSecond float64 `json:"bits_per_second"`
				LostPercent   float64 `json:"lost_percent"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		return UDPResult{}, fmt.Errorf("iperf3 report: %w", err)
	}
	if rep.Error != "" {
		return UDPResult{}, fmt.Errorf("iperf3: %s", rep.Error)
	}
	return UDPResult{Offered: rep.End.Sent.BitsPerSecond, Received: rep.End.Received.BitsPerSecond, LostPercent: rep.End.Received.LostPercent}, nil
}

// waitListening waits until the flow's iperf3 server listens: binding its
// port in its namespace then fails.
func waitListening(f Flow) error {
	for try := 0; try < 250; try++ {
		var l net.Listener
		err := In(f.To, func() (err error) {
			l, err = net.Listen("tcp", f.ToAddr)
			return err
		})
		if err != nil {
			return nil
		}
		l.Close()
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("iperf3 server on %s never listened", f.ToAddr)
}
