package lazyproxy

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// DefaultMaxLazyPages is PrefetchConfig.MaxPages' default: 64 GiB of
// pages, more than any service an edge node runs.
const DefaultMaxLazyPages = 64 << 30 / pageSize

// ErrBadRuns: the lazy runs given to ServePrefetch are not a plausible
// set of pages (unaligned, past the end of the address space, overlapping,
// or more pages than the limit). They come from the source's pagemaps.
var ErrBadRuns = errors.New("lazyproxy: bad lazy runs")

// maxPageNumber is one past the last page of the 64-bit address space.
const maxPageNumber = 1 << 64 / pageSize

// planRanges returns ranges sorted by process and address, runs of no
// pages left out, once they are checked: page-aligned, within the address
// space, not overlapping, and at most maxPages pages in all. It allocates
// in proportion to the runs, never to their pages.
func planRanges(ranges []Range, maxPages uint64) ([]Range, error) {
	var total uint64
	for _, r := range ranges {
		switch {
		case r.Pages == 0:
			continue
		case r.Addr%pageSize != 0:
			return nil, fmt.Errorf("%w: run of pid %d at %#x is not page-aligned", ErrBadRuns, r.PID, r.Addr)
		case r.Pages > maxPages:
			return nil, fmt.Errorf("%w: run of %d pages at %#x of pid %d exceeds the limit of %d lazy pages (%d MiB)",
				ErrBadRuns, r.Pages, r.Addr, r.PID, maxPages, maxPages*pageSize>>20)
		case r.Pages > maxPageNumber-r.Addr/pageSize:
			return nil, fmt.Errorf("%w: run of %d pages at %#x of pid %d ends past the address space", ErrBadRuns, r.Pages, r.Addr, r.PID)
		}
		// Both terms are at most maxPages: no overflow.
		if total += r.Pages; total > maxPages {
			return nil, fmt.Errorf("%w: the runs hold more than the limit of %d lazy pages (%d MiB), passed at the run of %d pages at %#x of pid %d",
				ErrBadRuns, maxPages, maxPages*pageSize>>20, r.Pages, r.Addr, r.PID)
		}
	}
	out := make([]Range, 0, len(ranges))
	for _, r := range ranges {
		if r.Pages > 0 {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Range) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.Addr, b.Addr))
	})
	for i := 1; i < len(out); i++ {
		p, r := out[i-1], out[i]
		if p.PID == r.PID && p.Addr/pageSize+p.Pages > r.Addr/pageSize {
			return nil, fmt.Errorf("%w: runs of pid %d overlap: %d pages at %#x and %d pages at %#x", ErrBadRuns, r.PID, p.Pages, p.Addr, r.Pages, r.Addr)
		}
	}
	return out, nil
}

// pageSet is a set of pages held as runs, however many pages they span:
// the lazy pages still owed to the daemon, or not asked for yet. Only
// page-aligned addresses are ever members.
type pageSet struct {
	// runs are sorted by process and page, disjoint and not adjacent.
	runs []pageRun
}

// pageRun is the pages [lo, hi) (page numbers: address / pageSize) of pid.
type pageRun struct {
	pid    uint32
	lo, hi uint64
}

// newPageSet holds the pages of ranges, which planRanges checked.
func newPageSet(ranges []Range) *pageSet {
	s := &pageSet{}
	for _, r := range ranges {
		s.add(r.PID, r.Addr, r.Pages)
	}
	return s
}

func (s *pageSet) clone() *pageSet { return &pageSet{runs: slices.Clone(s.runs)} }

func (s *pageSet) empty() bool { return len(s.runs) == 0 }

// pages counts the pages held.
func (s *pageSet) pages() uint64 {
	var n uint64
	for _, r := range s.runs {
		n += r.hi - r.lo
	}
	return n
}

// after is the index of the first run of pid, or of a later process, that
// ends after page pn.
func (s *pageSet) after(pid uint32, pn uint64) int {
	i, _ := slices.BinarySearchFunc(s.runs, pageRun{pid: pid, hi: pn}, func(r, t pageRun) int {
		return cmp.Or(cmp.Compare(r.pid, t.pid), cmp.Compare(r.hi, t.hi+1))
	})
	return i
}

// contains says whether the page at addr of pid is in the set.
func (s *pageSet) contains(pid uint32, addr uint64) bool {
	in, _ := s.span(pid, addr, 1)
	return in
}

// span says whether the page at addr of pid is in the set, and how many
// pages from it, at most limit (>= 1), are all in it or all out of it.
func (s *pageSet) span(pid uint32, addr, limit uint64) (in bool, n uint64) {
	if addr%pageSize != 0 {
		return false, limit
	}
	pn := addr / pageSize
	i := s.after(pid, pn)
	if i == len(s.runs) || s.runs[i].pid != pid {
		return false, limit
	}
	if r := s.runs[i]; r.lo <= pn {
		return true, min(limit, r.hi-pn)
	}
	return false, min(limit, s.runs[i].lo-pn)
}

// add puts n pages from addr of pid in the set.
func (s *pageSet) add(pid uint32, addr, n uint64) {
	if addr%pageSize != 0 || n == 0 {
		return
	}
	lo := addr / pageSize
	hi := lo + n
	// Runs that overlap or touch [lo, hi) merge with it.
	i := s.after(pid, lo)
	if i > 0 && s.runs[i-1].pid == pid && s.runs[i-1].hi == lo {
		i--
	}
	j := i
	for j < len(s.runs) && s.runs[j].pid == pid && s.runs[j].lo <= hi {
		lo, hi = min(lo, s.runs[j].lo), max(hi, s.runs[j].hi)
		j++
	}
	s.runs = slices.Replace(s.runs, i, j, pageRun{pid, lo, hi})
}

// remove takes n pages from addr of pid out of the set.
func (s *pageSet) remove(pid uint32, addr, n uint64) {
	if addr%pageSize != 0 || n == 0 {
		return
	}
	lo := addr / pageSize
	hi := lo + n
	i := s.after(pid, lo)
	j := i
	for j < len(s.runs) && s.runs[j].pid == pid && s.runs[j].lo < hi {
		j++
	}
	if i == j {
		return
	}
	var keep [2]pageRun
	k := 0
	if first := s.runs[i]; first.lo < lo {
		keep[k] = pageRun{pid, first.lo, lo}
		k++
	}
	if last := s.runs[j-1]; last.hi > hi {
		keep[k] = pageRun{pid, hi, last.hi}
		k++
	}
	s.runs = slices.Replace(s.runs, i, j, keep[:k]...)
}
