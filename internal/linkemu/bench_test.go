package linkemu_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linkemu"
)

// The benchmarks produce the accuracy table of the package's report:
//
//	go test -run '^$' -bench . -benchtime 1x ./internal/linkemu/
//
// Each sub-benchmark builds a fresh star, runs the daemon as its own
// process in the core (as the testbed does), configures link A (both
// directions) and measures a→b; link B has no delay and no rate.

// BenchmarkRTT measures RTT for a one-way delay d on link A: expect 2d.
func BenchmarkRTT(b *testing.B) {
	for _, d := range []time.Duration{ms(1), ms(5), ms(25), ms(75)} {
		b.Run(fmt.Sprintf("delay=%v", d), func(b *testing.B) {
			s := newStar(b)
			s.installRules(b)
			sock := s.startDaemonProcess(b, map[uint16]linkemu.Params{qUpA: {Delay: d}, qDownA: {Delay: d}}).sock
			var m linkemu.Measurement
			for b.Loop() {
				m = s.measure(b, 50, -1)
			}
			st, err := linkemu.Status(context.Background(), sock)
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("configured RTT %v: %s; release lateness mean/max up %dµs/%dµs down %dµs/%dµs", 2*d, fmtM(m),
				st[qUpA].LateUS, st[qUpA].MaxLateUS, st[qDownA].LateUS, st[qDownA].MaxLateUS)
			b.ReportMetric(float64(m.RTTMedian)/1e6, "rtt-median-ms")
			b.ReportMetric(float64(m.RTTP99)/1e6, "rtt-p99-ms")
		})
	}
}

// BenchmarkThroughput measures a→b goodput for a rate and one-way delay on
// link A.
func BenchmarkThroughput(b *testing.B) {
	for _, tc := range []struct {
		rate    uint64
		delay   time.Duration
		bigBufs bool
	}{
		{0, 0, false}, {0, ms(20), false}, {0, ms(20), true},
		{1_000_000_000, 0, false}, {1_000_000_000, ms(20), false}, {1_000_000_000, ms(20), true},
		{100_000_000, 0, false}, {100_000_000, ms(20), false},
		{10_000_000, 0, false}, {300_000_000, 0, false}, {5_000_000_000, 0, false},
	} {
		b.Run(fmt.Sprintf("rate=%dM/delay=%v/bigbufs=%v", tc.rate/1_000_000, tc.delay, tc.bigBufs), func(b *testing.B) {
			s := newStar(b)
			s.installRules(b)
			if tc.bigBufs {
				s.bigTCPBuffers(b)
			}
			sock := s.startDaemonProcess(b, map[uint16]linkemu.Params{qUpA: {Delay: tc.delay}, qDownA: {Delay: tc.delay}}).sock
			s.shapeA(b, tc.rate)
			var m linkemu.Measurement
			for b.Loop() {
				m = s.measure(b, 10, 4*time.Second)
			}
			st, err := linkemu.Status(context.Background(), sock)
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("rate %d Mbit/s, delay %v each way: %s; queue up: %+v", tc.rate/1_000_000, tc.delay, fmtM(m), st[qUpA])
			b.ReportMetric(m.Mbps(), "Mbit/s")
			b.ReportMetric(m.AvgThroughput/1e6, "avg-Mbit/s")
		})
	}
}
