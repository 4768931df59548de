package workload

import (
	"bytes"
	"compress/flate"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

func TestPageIsAFunctionOfSeedIndexVersion(t *testing.T) {
	a := make([]byte, PageSize)
	b := make([]byte, PageSize)
	FillPage(a, 7, 3, 5)
	FillPage(b, 7, 3, 5)
	if !bytes.Equal(a, b) {
		t.Fatal("same (seed, index, version) gave different pages")
	}
	for _, tc := range []struct {
		name                string
		seed                uint64
		index               int
		version             uint32
		stampSame, bodySame bool
	}{
		{"other seed", 8, 3, 5, false, false},
		{"other index", 7, 4, 5, false, false},
		{"other version", 7, 3, 6, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			FillPage(b, tc.seed, tc.index, tc.version)
			if got := bytes.Equal(a[:StampSize], b[:StampSize]); got != tc.stampSame {
				t.Errorf("stamps equal = %v, want %v", got, tc.stampSame)
			}
			if got := bytes.Equal(a[StampSize:], b[StampSize:]); got != tc.bodySame {
				t.Errorf("bodies equal = %v, want %v", got, tc.bodySame)
			}
			if CheckPage(b, 7, 3, 5) {
				t.Error("CheckPage accepted another page's content")
			}
			if !CheckPage(b, tc.seed, tc.index, tc.version) {
				t.Error("CheckPage rejected FillPage's own output")
			}
		})
	}
	// WriteStamp over an older version gives exactly FillPage's page.
	FillPage(b, 7, 3, 1)
	WriteStamp(b, 7, 3, 5)
	if !bytes.Equal(a, b) {
		t.Error("WriteStamp of version 5 over version 1 differs from FillPage at version 5")
	}
}

// The paper initialises the state "to random values to maximize entropy
// and, hence, avoid compression" (Sec. IV-B).
func TestPagesDoNotCompress(t *testing.T) {
	const n = 64
	buf := make([]byte, n*PageSize)
	for i := 0; i < n; i++ {
		FillPage(buf[i*PageSize:], 1, i, 0)
	}
	var out bytes.Buffer
	w, _ := flate.NewWriter(&out, flate.BestCompression)
	w.Write(buf)
	w.Close()
	if ratio := float64(out.Len()) / float64(len(buf)); ratio < 0.99 {
		t.Fatalf("state compresses to %.3f of its size; want incompressible", ratio)
	}
}

func TestCheckDetectsCorruption(t *testing.T) {
	const pages, hot = 50, 40
	for _, tc := range []struct {
		name    string
		corrupt func(m *Memory)
		page    int
		reason  string
	}{
		{"intact", func(*Memory) {}, -1, ""},
		{"flipped byte in body", func(m *Memory) { m.buf[17*PageSize+3000] ^= 0x01 }, 17, BadContent},
		{"flipped byte in stamp", func(m *Memory) { m.buf[9*PageSize+20] ^= 0x80 }, 9, BadContent},
		{"flipped byte in cold page", func(m *Memory) { m.buf[45*PageSize+100] ^= 0x10 }, 45, BadContent},
		{"last byte of the state", func(m *Memory) { m.buf[len(m.buf)-1] ^= 0xff }, pages - 1, BadContent},
		{"page restored from an older version", func(m *Memory) {
			FillPage(m.page(12), m.seed, 12, m.versions[12]-1)
		}, 12, BadContent},
		{"stale page and stale version", func(m *Memory) {
			m.versions[12]--
			FillPage(m.page(12), m.seed, 12, m.versions[12])
		}, 12, BadVersion},
		{"zeroed page", func(m *Memory) { clear(m.page(30)) }, 30, BadContent},
		{"lost write counter", func(m *Memory) { m.writes--; m.cursor = int(m.writes % uint64(m.hot)) }, 4, BadVersion},
		{"cursor off", func(m *Memory) { m.cursor = (m.cursor + 1) % m.hot }, 6, BadCursor},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMemory(42, pages, hot)
			if err != nil {
				t.Fatal(err)
			}
			m.Write(3*hot + 5) // versions 4 for pages 0..4, 3 for 5..39, 0 for 40..49
			tc.corrupt(m)
			r := m.Check()
			if r.BadPage != tc.page || r.Reason != tc.reason {
				t.Fatalf("Check = bad page %d (%q), want %d (%q)", r.BadPage, r.Reason, tc.page, tc.reason)
			}
			if tc.page < 0 {
				if !r.OK() || r.VersionSum != r.Writes || r.Writes != 3*hot+5 || r.Pages != pages {
					t.Fatalf("intact state: %+v", r)
				}
			} else if r.OK() {
				t.Fatal("corrupted state reported OK")
			}
		})
	}
}

func TestWriteCyclesOverHotPages(t *testing.T) {
	m, err := NewMemory(1, 10, 4)
	if err != nil {
		t.Fatal(err)
	}
	m.Write(1)
	m.Write(9) // 10 writes over 4 hot pages: versions 3 3 2 2, cold pages 0
	want := []uint32{3, 3, 2, 2, 0, 0, 0, 0, 0, 0}
	for i, v := range m.versions {
		if v != want[i] || VersionAfter(10, 4, i) != want[i] {
			t.Fatalf("versions %v (VersionAfter %d for %d), want %v", m.versions, VersionAfter(10, 4, i), i, want)
		}
	}
	if r := m.Check(); !r.OK() || r.VersionSum != 10 {
		t.Fatalf("Check = %+v", r)
	}
	if _, err := NewMemory(1, 0, 0); !errors.Is(err, ErrBadSize) {
		t.Errorf("NewMemory(0 pages) = %v, want ErrBadSize", err)
	}
	if _, err := NewMemory(1, 4, 5); !errors.Is(err, ErrBadSize) {
		t.Errorf("NewMemory(hot > pages) = %v, want ErrBadSize", err)
	}
}

func TestPacer(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type step struct {
		at   time.Duration // since t0
		want int
	}
	for _, tc := range []struct {
		name   string
		rate   float64
		maxGap time.Duration
		steps  []step
		gaps   int
	}{
		{"R_min: one page per second", 1, 2 * time.Second, []step{{10 * time.Millisecond, 0}, {990 * time.Millisecond, 0}, {1000 * time.Millisecond, 1}, {1100 * time.Millisecond, 0}, {2000 * time.Millisecond, 1}}, 0},
		{"evenly spread", 1000, 250 * time.Millisecond, []step{{10 * time.Millisecond, 10}, {20 * time.Millisecond, 10}, {25 * time.Millisecond, 5}, {125 * time.Millisecond, 100}}, 0},
		{"fractional writes carry over", 150, 250 * time.Millisecond, []step{{10 * time.Millisecond, 1}, {20 * time.Millisecond, 2}, {30 * time.Millisecond, 1}, {40 * time.Millisecond, 2}}, 0},
		{"late tick within max gap catches up", 1000, 250 * time.Millisecond, []step{{10 * time.Millisecond, 10}, {200 * time.Millisecond, 190}}, 0},
		{"freeze longer than max gap skips its writes", 1000, 250 * time.Millisecond, []step{{10 * time.Millisecond, 10}, {3 * time.Second, 0}, {3010 * time.Millisecond, 10}, {3020 * time.Millisecond, 10}}, 1},
		{"two freezes", 100, 250 * time.Millisecond, []step{{100 * time.Millisecond, 10}, {time.Second, 0}, {1100 * time.Millisecond, 10}, {5 * time.Second, 0}, {5200 * time.Millisecond, 20}}, 2},
		{"clock going back", 1000, 250 * time.Millisecond, []step{{100 * time.Millisecond, 100}, {50 * time.Millisecond, 0}, {110 * time.Millisecond, 10}}, 0},
		{"progress kept across a freeze", 2, 250 * time.Millisecond, []step{{200 * time.Millisecond, 0}, {400 * time.Millisecond, 0}, {2400 * time.Millisecond, 0}, {2500 * time.Millisecond, 1}, {2750 * time.Millisecond, 0}, {2990 * time.Millisecond, 0}, {3000 * time.Millisecond, 1}}, 1},
		{"rate zero", 0, 250 * time.Millisecond, []step{{100 * time.Millisecond, 0}, {200 * time.Millisecond, 0}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPacer(tc.rate, tc.maxGap, t0)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tc.steps {
				if got := p.Due(t0.Add(s.at)); got != s.want {
					t.Fatalf("step %d at %v: Due = %d, want %d", i, s.at, got, s.want)
				}
			}
			if p.Gaps() != tc.gaps {
				t.Errorf("Gaps = %d, want %d", p.Gaps(), tc.gaps)
			}
		})
	}
	// A pause the caller announces with Resume is not a gap, and its time
	// is taken out of the clock.
	p, _ := NewPacer(100, 250*time.Millisecond, t0)
	if n := p.Due(t0.Add(100 * time.Millisecond)); n != 10 {
		t.Fatalf("Due = %d, want 10", n)
	}
	p.Resume(t0.Add(900 * time.Millisecond))
	if n := p.Due(t0.Add(950 * time.Millisecond)); n != 5 || p.Gaps() != 0 {
		t.Fatalf("after a resumed pause: Due = %d (want 5), gaps %d (want 0)", n, p.Gaps())
	}
	if _, err := NewPacer(-1, time.Second, t0); err == nil {
		t.Error("negative rate accepted")
	}
}

// Over a long run without gaps the pacer hands out exactly ⌊rate·elapsed⌋
// writes, whatever the tick jitter.
func TestPacerLongRunExact(t *testing.T) {
	t0 := time.Unix(0, 0)
	p, _ := NewPacer(2441, 250*time.Millisecond, t0)
	total := 0
	now := t0
	for i := 0; i < 10000; i++ {
		now = now.Add(time.Duration(3+i%17) * time.Millisecond)
		total += p.Due(now)
	}
	if want := int(2441 * now.Sub(t0).Nanoseconds() / 1e9); total != want {
		t.Fatalf("%d writes over %v, want %d", total, now.Sub(t0), want)
	}
}

func TestResolveRate(t *testing.T) {
	for _, tc := range []struct {
		spec     string
		hot      int
		interval time.Duration
		want     float64
		err      bool
	}{
		{"min", 2441, time.Second, 1, false},
		{"max", 2441, time.Second, 2441, false},
		{"MAX", 100, 2 * time.Second, 50, false},
		{"min", 100, 500 * time.Millisecond, 2, false},
		{"123.5", 100, time.Second, 123.5, false},
		{"0", 100, time.Second, 0, false},
		{"-1", 100, time.Second, 0, true},
		{"fast", 100, time.Second, 0, true},
		{"max", 100, 0, 0, true},
	} {
		got, err := ResolveRate(tc.spec, tc.hot, tc.interval)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ResolveRate(%q, %d, %v) = %v, %v; want %v (error %v)", tc.spec, tc.hot, tc.interval, got, err, tc.want, tc.err)
		}
	}
	if Pages(10e6) != 2441 || Pages(4095) != 0 || HotPages(293, 0.2) != 59 || HotPages(10, 0) != 10 || HotPages(10, 0.01) != 1 {
		t.Errorf("Pages/HotPages: %d %d %d %d %d", Pages(10e6), Pages(4095), HotPages(293, 0.2), HotPages(10, 0), HotPages(10, 0.01))
	}
}

func TestParseReplies(t *testing.T) {
	for _, tc := range []struct {
		line string
		want CheckReply
		err  bool
	}{
		{"ok 2441 12345\n", CheckReply{OK: true, Pages: 2441, VersionSum: 12345, BadPage: -1, Line: "ok 2441 12345"}, false},
		{"bad 17 content\n", CheckReply{BadPage: 17, Reason: "content", Line: "bad 17 content"}, false},
		{"bad 3", CheckReply{BadPage: 3, Line: "bad 3"}, false},
		{"ok 0 0", CheckReply{}, true},
		{"ok 12", CheckReply{}, true},
		{"bad x", CheckReply{}, true},
		{"error unknown", CheckReply{}, true},
		{"", CheckReply{}, true},
	} {
		got, err := ParseCheckReply(tc.line)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseCheckReply(%q) = %+v, %v; want %+v (error %v)", tc.line, got, err, tc.want, tc.err)
		}
		if err != nil && !errors.Is(err, ErrProtocol) {
			t.Errorf("ParseCheckReply(%q) error %v is not ErrProtocol", tc.line, err)
		}
	}
	s := Stats{Pages: 10, Hot: 2, Writes: 99, Rate: 0.5, Gaps: 1, Seed: 3}
	if got, err := ParseStats(StatsLine(s)); err != nil || got != s {
		t.Errorf("stats round trip: %+v, %v; want %+v", got, err, s)
	}
	if _, err := ParseStats("stats pages=x"); !errors.Is(err, ErrProtocol) {
		t.Errorf("bad stats accepted: %v", err)
	}
}

// A real generator served on loopback: the check sees the writes, and a
// byte flipped behind its back is reported.
func TestServeCheckOverTCP(t *testing.T) {
	cfg := DefaultConfig()
	cfg.StateBytes = 2e6
	cfg.Rate = "5000"
	cfg.Tick = 2 * time.Millisecond
	g, err := NewGenerator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); g.Run(ctx) }()
	go func() {
		defer wg.Done()
		if err := Serve(ctx, ln, g); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	defer wg.Wait()
	defer cancel()

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(conn)
	defer c.Close()
	first, err := c.Check(ctx)
	if err != nil || !first.OK || first.Pages != Pages(2e6) {
		t.Fatalf("first check = %+v, %v", first, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	var st Stats
	for {
		if st, err = c.Stats(ctx); err != nil {
			t.Fatal(err)
		}
		if st.Writes > first.VersionSum+100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no writes in 10 s: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st.Rate != 5000 || st.Pages != Pages(2e6) || st.Hot != st.Pages {
		t.Errorf("stats %+v", st)
	}
	second, err := c.Check(ctx)
	if err != nil || !second.OK || second.VersionSum <= first.VersionSum {
		t.Fatalf("second check = %+v, %v (first %+v)", second, err, first)
	}
	g.mem.mu.Lock()
	g.mem.buf[321*PageSize+777] ^= 0x04
	g.mem.mu.Unlock()
	bad, err := c.Check(ctx)
	if err != nil || bad.OK || bad.BadPage != 321 || bad.Reason != BadContent {
		t.Fatalf("check after a flipped byte = %+v, %v", bad, err)
	}
	if line, err := c.roundTrip(ctx, "nonsense"); err != nil || line[:5] != "error" {
		t.Errorf("unknown request answered %q, %v", line, err)
	}
}
