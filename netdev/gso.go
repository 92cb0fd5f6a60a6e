package netdev

// gsoBurstMs is how much of a share's egress rate one GSO super-packet of
// its pod may carry. HTB lets a super-packet out whole, at once, and
// charges the share's class after: a 64 KiB one is a 52 ms burst at 10M.
// BBR (the default of this project's machines) reads such a burst, when
// it finds the share's queue empty, as a far faster path, and floods the
// queue: one flow at a 10M share with the kernel's 64 KiB super-packets got
// 4.9 Mbit/s in three of six 2-second runs, and retransmitted a quarter of
// what it sent at 20M; CUBIC held its rate either way. At 4 ms BBR held
// 9.6, 19.1, 47.8 and 95.7 at 10M to 100M in every run. Each halving of the
// super-packet costs CPU: at a hundred 10M shares, CPU s per shaped Gbit/s
// was 0.5 with 64 KiB, 1.16 at 4 ms (3 segments) and 1.49 at 2 ms
// (netdev/MEASURED.md, "Super-packets and BBR").
const gsoBurstMs = 4

// gsoMinSegs is the smallest GSO limit carve sets: TCP small queues keep
// two super-packets of a flow in the queue, and one segment each would
// double the frames HTB handles at a 10M share for no gain measured.
const gsoMinSegs = 2

// gsoMaxSegs is the GSO limit of a share's interface in its pod, in
// segments of mtu, for an egress rate of egress bits/s: about gsoBurstMs of
// the rate, never under gsoMinSegs; 0 (the kernel's 64 KiB) where the
// limit would be no less than that, or the share's egress is unlimited.
func gsoMaxSegs(egress uint64, mtu int) int {
	if egress == 0 || mtu <= 0 {
		return 0
	}
	segs := egress / 8 * gsoBurstMs / 1000 / uint64(mtu)
	if segs*uint64(mtu) >= 64<<10 {
		return 0
	}
	return int(max(segs, gsoMinSegs))
}
