package nettest

import (
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netns"
)

// EchoRTT measures round trips of small UDP probes from ns `from` to an
// echo served in ns `to` at addr (host:port), one every interval for d, and
// returns them sorted. Probes dropped on the way (a full queue) are left
// out; lost is how many.
func EchoRTT(from, to netns.NsHandle, addr string, interval, d time.Duration) (rtts []time.Duration, lost int, err error) {
	var srv net.PacketConn
	if err := In(to, func() (err error) { srv, err = net.ListenPacket("udp", addr); return err }); err != nil {
		return nil, 0, fmt.Errorf("echo server on %s: %w", addr, err)
	}
	defer srv.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			n, peer, err := srv.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = srv.WriteTo(buf[:n], peer)
		}
	}()
	var c net.Conn
	if err := In(from, func() (err error) { c, err = net.Dial("udp", addr); return err }); err != nil {
		return nil, 0, fmt.Errorf("echo client to %s: %w", addr, err)
	}
	start := time.Now()
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if n == 8 {
				// The probe carries its send time since start.
				rtt := time.Since(start) - time.Duration(binary.BigEndian.Uint64(buf))
				mu.Lock()
				rtts = append(rtts, rtt)
				mu.Unlock()
			}
		}
	}()
	sent := 0
	for time.Since(start) < d {
		b := binary.BigEndian.AppendUint64(nil, uint64(time.Since(start)))
		if _, err := c.Write(b); err == nil {
			sent++
		}
		time.Sleep(interval)
	}
	time.Sleep(2 * time.Second) // replies still queued somewhere
	c.Close()
	<-done
	slices.Sort(rtts)
	return rtts, sent - len(rtts), nil
}

// Quantile is the q-quantile (0..1) of sorted durations; 0 when empty.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(int(q*float64(len(sorted))), len(sorted)-1)]
}
