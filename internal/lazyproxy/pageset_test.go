package lazyproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestPrefetchRefusesHugeRun: a peer's pagemap claiming a run of 2^45
// pages (128 PiB) is refused at once, naming the limit and the run,
// without a page's worth of bookkeeping or a connection upstream; the
// daemon's listener is closed so that it fails rather than waits.
func TestPrefetchRefusesHugeRun(t *testing.T) {
	l := listen(t)
	dialled := false
	up := func(context.Context) (net.Conn, error) {
		dialled = true
		return nil, errors.New("not reached")
	}
	huge := []Range{{PID: 1, Addr: 0x10000, Pages: 1}, {PID: 7, Addr: 0x7f0000000000, Pages: 1 << 45}}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	err := ServePrefetch(context.Background(), l, up, nil, huge, &Stats{}, nil)
	d := time.Since(start)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrBadRuns) {
		t.Fatalf("ServePrefetch: %v, want ErrBadRuns", err)
	}
	for _, want := range []string{"35184372088832 pages", "0x7f0000000000", "pid 7", "limit of 16777216 lazy pages"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if d > time.Second {
		t.Errorf("refused after %v", d)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Errorf("allocated %d bytes to refuse the run", alloc)
	}
	if dialled {
		t.Error("dialled the page server for runs it refused")
	}
	if _, err := l.Accept(); err == nil {
		t.Error("the daemon's listener is still open")
	}
	// planRanges allocates only its error's message for a refused run.
	if n := testing.AllocsPerRun(100, func() { _, _ = planRanges(huge[1:], DefaultMaxLazyPages) }); n > 10 {
		t.Errorf("planRanges: %v allocations to refuse a run", n)
	}
}

func TestPlanRanges(t *testing.T) {
	const max = 1000
	tests := []struct {
		name   string
		ranges []Range
		err    string // "" for accepted
	}{
		{"ok, sorted, empty run dropped", []Range{{2, 0x2000, 3}, {1, 0x5000, 2}, {1, 0x1000, 4}, {1, 0x9000, 0}}, ""},
		{"adjacent", []Range{{1, 0x1000, 1}, {1, 0x2000, 1}}, ""},
		{"same address, other process", []Range{{1, 0x1000, 1}, {2, 0x1000, 1}}, ""},
		{"exactly the limit", []Range{{1, 0, 600}, {2, 0, 400}}, ""},
		{"overlap", []Range{{1, 0x1000, 2}, {1, 0x2000, 1}}, "overlap"},
		{"duplicate", []Range{{3, 0x1000, 1}, {3, 0x1000, 1}}, "overlap"},
		{"unaligned", []Range{{1, 0x1001, 1}}, "not page-aligned"},
		{"one run over the limit", []Range{{1, 0, max + 1}}, "exceeds the limit of 1000"},
		{"all runs over the limit", []Range{{1, 0, 600}, {2, 0, 401}}, "more than the limit of 1000"},
		{"past the address space", []Range{{1, 0xfffffffffffff000, 2}}, "past the address space"},
		{"last page of the address space", []Range{{1, 0xfffffffffffff000, 1}}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := planRanges(tc.ranges, max)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				for i := 1; i < len(out); i++ {
					if a, b := out[i-1], out[i]; a.PID > b.PID || a.PID == b.PID && a.Addr >= b.Addr {
						t.Fatalf("not sorted: %+v", out)
					}
				}
				for _, r := range out {
					if r.Pages == 0 {
						t.Fatalf("empty run kept: %+v", out)
					}
				}
				return
			}
			if !errors.Is(err, ErrBadRuns) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("planRanges: %v, want ErrBadRuns saying %q", err, tc.err)
			}
		})
	}
}

// decodeRanges reads runs of 16 bytes from b: pid (1 byte, so that runs
// meet), page number (7 bytes), page count (8 bytes).
func decodeRanges(b []byte) []Range {
	var out []Range
	for ; len(b) >= 16; b = b[16:] {
		out = append(out, Range{
			PID:   uint32(b[0] % 4),
			Addr:  binary.BigEndian.Uint64(b[0:8]) & (1<<56 - 1) * pageSize,
			Pages: binary.BigEndian.Uint64(b[8:16]),
		})
	}
	return out
}

func encodeRanges(rs []Range) []byte {
	var b []byte
	for _, r := range rs {
		var e [16]byte
		binary.BigEndian.PutUint64(e[0:], r.Addr/pageSize)
		e[0] = byte(r.PID)
		binary.BigEndian.PutUint64(e[8:], r.Pages)
		b = append(b, e[:]...)
	}
	return b
}

// FuzzPlanRanges: a peer's lazy runs, whatever they claim, are checked
// quickly and without per-page work: what is accepted is sorted, disjoint,
// within the address space and the limit, and holds the pages the input
// holds (the page set built from it agrees).
func FuzzPlanRanges(f *testing.F) {
	f.Add(encodeRanges([]Range{{1, 0x1000, 4}, {1, 0x5000, 2}, {2, 0x1000, 1}}))
	f.Add(encodeRanges([]Range{{1, 0x7f0000000000, 1 << 45}}))
	f.Add(encodeRanges([]Range{{1, 0x1000, 2}, {1, 0x2000, 1}}))
	f.Add(encodeRanges([]Range{{3, 0xfffffffffffff000, 2}}))
	const max = 1 << 20
	f.Fuzz(func(t *testing.T, in []byte) {
		ranges := decodeRanges(in)
		out, err := planRanges(ranges, max)
		if err != nil {
			if !errors.Is(err, ErrBadRuns) {
				t.Fatalf("error %v is not ErrBadRuns", err)
			}
			return
		}
		var total, want uint64
		for i, r := range out {
			if r.Pages == 0 || r.Addr%pageSize != 0 || r.Pages > maxPageNumber-r.Addr/pageSize {
				t.Fatalf("accepted run %+v", r)
			}
			if i > 0 {
				p := out[i-1]
				if p.PID > r.PID || p.PID == r.PID && p.Addr/pageSize+p.Pages > r.Addr/pageSize {
					t.Fatalf("accepted %+v then %+v", p, r)
				}
			}
			total += r.Pages
		}
		for _, r := range ranges {
			want += r.Pages
		}
		if total > max || total != want {
			t.Fatalf("accepted %d pages of %d, the limit is %d", total, want, max)
		}
		s := newPageSet(out)
		if s.pages() != total {
			t.Fatalf("page set holds %d pages, the runs %d", s.pages(), total)
		}
		for _, r := range out {
			if !s.contains(r.PID, r.Addr) || !s.contains(r.PID, r.Addr+(r.Pages-1)*pageSize) {
				t.Fatalf("page set lacks an end of %+v", r)
			}
			if in, n := s.span(r.PID, r.Addr, r.Pages); !in || n != r.Pages {
				t.Fatalf("span of %+v: %v %d", r, in, n)
			}
		}
	})
}

// FuzzPageSet applies the fuzzer's adds and removes to a page set and to
// a map of pages, and compares them page by page.
func FuzzPageSet(f *testing.F) {
	f.Add([]byte{0, 1, 5, 10, 1, 1, 7, 2, 0, 0, 0, 20, 1, 0, 3, 3})
	f.Add([]byte{0, 2, 0, 64, 1, 2, 8, 8, 0, 2, 8, 8, 1, 2, 0, 64})
	const pages = 64
	f.Fuzz(func(t *testing.T, ops []byte) {
		s := &pageSet{}
		model := map[pageKey]bool{}
		for ; len(ops) >= 4; ops = ops[4:] {
			op, pid, lo, n := ops[0]%2, uint32(ops[1]%3), uint64(ops[2]%pages), uint64(ops[3]%pages)
			addr := lo * pageSize
			for i := uint64(0); i < n; i++ {
				model[pageKey{pid, addr + i*pageSize}] = op == 0
			}
			if op == 0 {
				s.add(pid, addr, n)
			} else {
				s.remove(pid, addr, n)
			}
			for i := 1; i < len(s.runs); i++ {
				a, b := s.runs[i-1], s.runs[i]
				if a.lo >= a.hi || a.pid > b.pid || a.pid == b.pid && a.hi >= b.lo {
					t.Fatalf("runs not sorted, disjoint and apart: %+v", s.runs)
				}
			}
		}
		var held uint64
		for pid := uint32(0); pid < 3; pid++ {
			for pn := uint64(0); pn < 2*pages; pn++ {
				addr := pn * pageSize
				want := model[pageKey{pid, addr}]
				if want {
					held++
				}
				if s.contains(pid, addr) != want {
					t.Fatalf("page %d of %d: set says %v, model %v (runs %+v)", pn, pid, !want, want, s.runs)
				}
				in, n := s.span(pid, addr, 2*pages)
				if in != want || n == 0 {
					t.Fatalf("span at page %d of %d: %v %d", pn, pid, in, n)
				}
				for i := uint64(0); i < n && pn+i < 2*pages; i++ {
					if model[pageKey{pid, addr + i*pageSize}] != in {
						t.Fatalf("span at page %d of %d: %v for %d pages, page %d differs", pn, pid, in, n, pn+i)
					}
				}
				if s.contains(pid, addr+1) {
					t.Fatalf("unaligned address %#x in the set", addr+1)
				}
			}
		}
		if s.pages() != held || s.empty() != (held == 0) {
			t.Fatalf("set holds %d pages (empty %v), model %d", s.pages(), s.empty(), held)
		}
	})
}
