package precopy

import (
	"context"
	"flag"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/testutil"
)

// rateConn paces writes to a link rate, as the emulated 1 Gbit/s edge
// link would (the receiver's side is loopback).
type rateConn struct {
	net.Conn
	bytesPerSec float64
	start       time.Time
	sent        int64
}

func (c *rateConn) Write(p []byte) (int, error) {
	if c.start.IsZero() {
		c.start = time.Now()
	}
	done := 0
	for done < len(p) {
		n := min(len(p)-done, 64<<10)
		due := c.start.Add(time.Duration(float64(c.sent+int64(n)) / c.bytesPerSec * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		w, err := c.Conn.Write(p[done : done+n])
		done += w
		c.sent += int64(w)
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

var (
	benchMB      = flag.Int("precopy.mb", 200, "BenchmarkPrecopy: the process's memory in MiB")
	benchCycleMs = flag.Int("precopy.cycle", 1000, "BenchmarkPrecopy: ms in which every hot page is rewritten once")
)

// BenchmarkPrecopy migrates a 200 MB process whose hot pages (5% or 20%
// of them) are each rewritten once a second, over a link paced at
// 1 Gbit/s: live rounds until the stop rule, CRIU dump, final delta.
// It reports per round and for the final. Run it alone:
//
//	go test -run '^$' -bench Precopy -benchtime 1x ./internal/precopy/
//
// -precopy.mb and -precopy.cycle change the size and the dirty rate.
func BenchmarkPrecopy(b *testing.B) {
	testutil.RequireRoot(b)
	testutil.RequireTool(b, "criu")
	for _, hotPct := range []int{5, 20} {
		b.Run(map[int]string{5: "dirty5", 20: "dirty20"}[hotPct], func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				benchOnce(b, hotPct)
			}
		})
	}
}

func benchOnce(b *testing.B, hotPct int) {
	const linkBps = 1e9 / 8
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := shmDir(b)
	spec := helperSpec{mb: *benchMB, hotPct: hotPct, cycleMs: *benchCycleMs, dir: dir}
	helper := startHelper(b, spec, false)
	pid := helper.pid
	npages, hot := readyInfo(b, spec)
	src, dst := connPair(b, func(c net.Conn) net.Conn { return &rateConn{Conn: c, bytesPerSec: linkBps} })
	source, err := NewSource(Config{Pid: pid})
	if err != nil {
		b.Fatal(err)
	}
	store, err := NewStore(filepath.Join(dir, "store"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	b.Logf("helper: %d pages, %d hot (%d%%), each rewritten every %d ms (%.1f MB/s)", npages, hot, hotPct, spec.cycleMs, float64(hot*PageSize)/float64(spec.cycleMs)/1e3)

	// Stop when the rest fits 100 ms of the link, when a round shrinks
	// by less than 10%, or after 10 rounds.
	rule := StopRule{MaxRounds: 10, DeltaBytes: linkBps / 10, MinShrink: 0.9}
	var wire int64
	t0 := time.Now()
	history, why := runRounds(b, ctx, source, store, src, dst, rule)
	live := time.Since(t0)
	for _, r := range history {
		wire += r.Bytes
		b.Logf("round %d: read %d pages in %v (%.0f MB/s), %d changed (%d data, %d zero, %d copy), %.1f MB on the wire, %v",
			r.Round, r.Pages, r.ReadTime.Round(time.Millisecond), r.ReadThroughput()/1e6, r.Changed, r.DataPages, r.ZeroPages, r.CopyPages,
			float64(r.Bytes)/1e6, r.Duration.Round(time.Millisecond))
	}
	b.Logf("stop: %s", why)
	dump := filepath.Join(dir, "dump")
	dumpTime := criuDump(b, pid, dump, true)
	f, rb := doFinal(b, ctx, source, store, src, dst, dump, filepath.Join(dir, "rebuilt"))
	changed := f.DataPages * PageSize
	b.Logf("live rounds %v, %.1f MB; criu dump %v; final %v: %d pages dumped (%.1f MB): %d held, %d copy, %d zero, %d data; wire %.2f MB meta + %.2f MB delta; delta/changed %.3f; final/dump %.3f",
		live.Round(time.Millisecond), float64(wire)/1e6, dumpTime.Round(time.Millisecond), f.Duration.Round(time.Millisecond),
		f.Pages, float64(f.DumpBytes)/1e6, f.HeldPages, f.CopyPages, f.ZeroPages, f.DataPages,
		float64(f.MetaBytes)/1e6, float64(f.DeltaBytes)/1e6, float64(f.DeltaBytes)/float64(max(1, changed)), float64(f.Bytes())/float64(f.DumpBytes))
	b.ReportMetric(float64(len(history)), "rounds")
	b.ReportMetric(float64(f.Bytes())/1e6, "final-MB")
	b.ReportMetric(float64(f.DumpBytes)/1e6, "dump-MB")
	b.ReportMetric(f.Duration.Seconds()*1000, "send-ms")
	b.ReportMetric(rb.Duration.Seconds()*1000, "rebuild-ms")
	b.ReportMetric(history[0].ReadThroughput()/1e6, "read-MB/s")
}

// BenchmarkFinal measures the frozen window's own cost, without CRIU: a
// synthetic 200 MB dump of which 2% changed since the rounds, sent as a
// final delta over unpaced loopback and rebuilt.
func BenchmarkFinal(b *testing.B) {
	const pages, a = 51200, 0x7f0000000000
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		dir := shmDir(b)
		dump := filepath.Join(dir, "dump")
		os.Mkdir(dump, 0o755)
		writePagemap(b, filepath.Join(dump, "pagemap-1.img"), 1, []pmEntry{{addr: a, pages: pages, flags: pePresent}})
		img := make([]byte, pages*PageSize)
		for p := 0; p < pages; p++ {
			copy(img[p*PageSize:], filled(uint64(p)+1))
		}
		// What the rounds left: the same pages; then 2% change.
		source, err := NewSource(Config{Pid: os.Getpid()})
		if err != nil {
			b.Fatal(err)
		}
		store, err := NewStore(filepath.Join(dir, "store"), nil)
		if err != nil {
			b.Fatal(err)
		}
		var e encoder
		e.single(roundBegin(&source.hash, 1))
		held := map[uint64]uint64{}
		for p := 0; p < pages; p++ {
			page := img[p*PageSize : (p+1)*PageSize]
			e.page(recData, 1, a+uint64(p)*PageSize, 0, 0, page)
			held[a/PageSize+uint64(p)] = source.hash.sum(page)
			if len(e.buf) > 8<<20 {
				e.flush()
				if err := store.applyRecords(e.buf); err != nil {
					b.Fatal(err)
				}
				e.buf = e.buf[:0]
			}
		}
		e.flush()
		if err := store.applyRecords(e.buf); err != nil {
			b.Fatal(err)
		}
		source.held[1] = held
		for p := 0; p < pages; p += 50 {
			img[p*PageSize+100]++
		}
		if err := os.WriteFile(filepath.Join(dump, "pages-1.img"), img, 0o644); err != nil {
			b.Fatal(err)
		}
		src, dst := connPair(b, nil)
		cpu0 := testutil.CPUTime(b)
		b.StartTimer()
		f, rb := doFinal(b, context.Background(), source, store, src, dst, dump, filepath.Join(dir, "rebuilt"))
		b.StopTimer()
		// Both sides' CPU: on the testbed's two cores the frozen window
		// is CPU-bound, so what the final costs there is its CPU time.
		b.ReportMetric(float64((testutil.CPUTime(b) - cpu0).Milliseconds()), "cpu-ms")
		b.ReportMetric(float64(f.DumpBytes)/1e6/f.Duration.Seconds(), "send-MB/s")
		b.ReportMetric(float64(f.DumpBytes)/1e6/rb.Duration.Seconds(), "rebuild-MB/s")
		store.Close()
		b.StartTimer()
	}
}
