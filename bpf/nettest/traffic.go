package nettest

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Flow is one TCP stream from a sender namespace to a receiver namespace.
type Flow struct {
	From, To netns.NsHandle
	// ToAddr is the receiver's address as the sender dials it, host:port.
	ToAddr string
}

// Result is what the receiver counted.
type Result struct {
	Bytes    int64
	Duration time.Duration
	// Delivered is, for a TCP flow, the payload the sender saw delivered
	// in the window (TCP_INFO's delivered segments, acknowledged or
	// selectively acknowledged, times the MSS); Bytes for UDP. Bytes is
	// what the receiver took in order, which moves by whatever was held
	// out of order at the window's edges: a share whose AQM drops a
	// fifth of a slow-started flow's frames held up to a hundred
	// kilobytes a flow out of order as its window opened, and 8 flows on
	// 10M read 1.08-1.20 of the limit in goodput while the wire carried
	// 0.97 of it, retransmissions included.
	Delivered int64
	// Retransmitted is, for a TCP flow, the payload its sender sent again
	// in the window (TCP_INFO's bytes_retrans): bytes a share's rate
	// carried twice, which a shaped flow's goodput loses.
	Retransmitted int64
	// RTOs and RTOTime are, for a TCP flow, its sender's retransmission
	// timeouts in the window and the time it spent recovering from them
	// (TCP_INFO's total_rto, total_rto_time; Linux 6.7 on, 0 before): time
	// a shaped flow sends nothing and its share's tokens go unspent.
	RTOs    int64
	RTOTime time.Duration
	// SRTT is the sender's smoothed round-trip time (TCP_INFO), sampled
	// every 100 ms over the measured window: TCP flows only.
	SRTT []time.Duration
}

// Goodput is in bits per second.
func (r Result) Goodput() float64 { return float64(r.Bytes) * 8 / r.Duration.Seconds() }

// DeliveredRate is Delivered in bits per second.
func (r Result) DeliveredRate() float64 { return float64(r.Delivered) * 8 / r.Duration.Seconds() }

// count is one flow's counters at one moment: what its receiver took in
// order, and what its sender saw delivered.
type count struct{ received, delivered, retransmitted, rtos, rtoMillis int64 }

// RunFlows runs the flows at the same time for d, after a warm-up (slow
// start, class queues filling) that is not counted, and returns the bytes
// each receiver got in the measured window.
// mark, when not nil, is called as the measured window opens and closes, so
// that other counters can be read over the same window.
func RunFlows(flows []Flow, warmup, d time.Duration, mark func()) ([]Result, error) {
	type running struct {
		l     net.Listener
		total atomic.Int64
		conn  atomic.Pointer[net.TCPConn]
		stop  chan struct{}
	}
	runs := make([]*running, len(flows))
	for i, f := range flows {
		l, err := Listen(f.To, f.ToAddr)
		if err != nil {
			return nil, err
		}
		r := &running{l: l, stop: make(chan struct{})}
		runs[i] = r
		go func() {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			if tc, ok := c.(*net.TCPConn); ok {
				r.conn.Store(tc)
			}
			buf := make([]byte, 256<<10)
			for {
				n, err := c.Read(buf)
				r.total.Add(int64(n))
				if err != nil {
					return
				}
			}
		}()
	}
	defer func() {
		for _, r := range runs {
			r.l.Close()
		}
	}()
	conns := make([]net.Conn, len(flows))
	for i, f := range flows {
		c, err := Dial(f.From, f.ToAddr)
		if err != nil {
			return nil, err
		}
		conns[i] = c
		go func(c net.Conn) {
			buf := make([]byte, 256<<10)
			for {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}(c)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// What each receiver's kernel has taken in, in order (TCP_INFO's
	// bytes_received), not what the receiving goroutine has read: a
	// reader that falls behind on a loaded machine would otherwise count
	// bytes that arrived before the window in it.
	totals := make([]func() count, len(runs))
	for i, r := range runs {
		totals[i] = func() count {
			n := count{received: r.total.Load()}
			if c := r.conn.Load(); c != nil {
				if got, ok := bytesReceived(c); ok {
					n.received = got
				}
			}
			n.delivered = n.received
			if tc, ok := conns[i].(*net.TCPConn); ok {
				if info, ok := tcpInfo(tc); ok {
					n.delivered = int64(info.Delivered) * int64(info.Snd_mss)
					n.retransmitted = int64(info.Bytes_retrans)
					n.rtos, n.rtoMillis = int64(info.Total_rto), int64(info.Total_rto_time)
				}
			}
			return n
		}
	}
	// The senders' smoothed RTT, sampled over the measured window.
	var measuring atomic.Bool
	srtts := make([][]time.Duration, len(conns))
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			if !measuring.Load() {
				continue
			}
			for i, c := range conns {
				if rtt, ok := smoothedRTT(c); ok {
					srtts[i] = append(srtts[i], rtt)
				}
			}
		}
	}()
	out := window(totals, warmup, d, func() {
		measuring.Store(!measuring.Load())
		if mark != nil {
			mark()
		}
	})
	close(stop)
	<-sampled
	for i := range out {
		out[i].SRTT = srtts[i]
	}
	return out, nil
}

// smoothedRTT is a TCP connection's smoothed RTT, from TCP_INFO.
func smoothedRTT(c net.Conn) (time.Duration, bool) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return 0, false
	}
	info, ok := tcpInfo(tc)
	if !ok {
		return 0, false
	}
	return time.Duration(info.Rtt) * time.Microsecond, true
}

// bytesReceived is what a TCP connection's kernel has received in order,
// from TCP_INFO.
func bytesReceived(c *net.TCPConn) (int64, bool) {
	info, ok := tcpInfo(c)
	if !ok {
		return 0, false
	}
	return int64(info.Bytes_received), true
}

// tcpInfo is the connection's TCP_INFO.
func tcpInfo(c *net.TCPConn) (*unix.TCPInfo, bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, false
	}
	var info *unix.TCPInfo
	var gerr error
	if err := raw.Control(func(fd uintptr) { info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil || gerr != nil {
		return nil, false
	}
	return info, true
}

// window waits out the warm-up, then counts what each flow got over d,
// calling mark just before the window opens and just after it closes.
// The duration is the time between the two reads of the flows' counts
// (microseconds each), with nothing else inside: the window once counted
// bytes across both marks and divided them by the sleep alone, and a mark
// that reads counters through netlink in other namespaces takes
// milliseconds, hundreds on a loaded machine.
func window(totals []func() count, warmup, d time.Duration, mark func()) []Result {
	time.Sleep(warmup)
	if mark != nil {
		mark()
	}
	t0 := time.Now()
	start := make([]count, len(totals))
	for i, total := range totals {
		start[i] = total()
	}
	time.Sleep(d)
	end := make([]count, len(totals))
	for i, total := range totals {
		end[i] = total()
	}
	elapsed := time.Since(t0)
	if mark != nil {
		mark()
	}
	out := make([]Result, len(totals))
	for i := range totals {
		out[i] = Result{
			Bytes:         end[i].received - start[i].received,
			Delivered:     end[i].delivered - start[i].delivered,
			Retransmitted: end[i].retransmitted - start[i].retransmitted,
			RTOs:          end[i].rtos - start[i].rtos,
			RTOTime:       time.Duration(end[i].rtoMillis-start[i].rtoMillis) * time.Millisecond,
			Duration:      elapsed,
		}
	}
	return out
}

// RunUDP sends UDP datagrams of size bytes as fast as the sockets allow on
// each flow for d after warmup, and returns what each receiver got in the
// measured window.
func RunUDP(flows []Flow, size int, warmup, d time.Duration, mark func()) ([]Result, error) {
	type running struct {
		c     net.PacketConn
		total atomic.Int64
	}
	runs := make([]*running, len(flows))
	for i, f := range flows {
		var pc net.PacketConn
		err := In(f.To, func() (err error) {
			pc, err = net.ListenPacket("udp", f.ToAddr)
			return err
		})
		if err != nil {
			return nil, err
		}
		r := &running{c: pc}
		runs[i] = r
		go func() {
			buf := make([]byte, 65536)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				r.total.Add(int64(n))
			}
		}()
	}
	defer func() {
		for _, r := range runs {
			r.c.Close()
		}
	}()
	stop := make(chan struct{})
	defer close(stop)
	for _, f := range flows {
		var c net.Conn
		err := In(f.From, func() (err error) {
			c, err = net.Dial("udp", f.ToAddr)
			return err
		})
		if err != nil {
			return nil, err
		}
		go func(c net.Conn) {
			defer c.Close()
			buf := make([]byte, size)
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = c.Write(buf)
			}
		}(c)
	}
	totals := make([]func() count, len(runs))
	for i, r := range runs {
		totals[i] = func() count { n := r.total.Load(); return count{received: n, delivered: n} }
	}
	return window(totals, warmup, d, mark), nil
}
