package workload

import (
	"errors"
	"fmt"
	"sync"
)

// Memory is DPRGen's state: a circular buffer of pages, the write version
// of every page and the number of writes done. Writes walk the first Hot
// pages in order (the circular buffer of Sec. IV-A; with a dirty fraction,
// ARNAB's hot part of the state), each one replacing the page's stamp with
// its next version.
//
// Because writes are sequential, the version of page i is a function of
// the write count alone (VersionAfter); Check verifies the tracked
// versions against it and every page's content against FillPage, so a
// lost, corrupted or stale page, or a stale copy of the versions, is
// caught.
//
// Memory is safe for concurrent use: one mutex serialises Write and Check.
type Memory struct {
	seed uint64
	hot  int

	mu       sync.Mutex // guards the fields below
	buf      []byte     // pages × PageSize
	versions []uint32   // write version of every page
	cursor   int        // next page to write, in [0, hot)
	writes   uint64     // writes done since allocation
}

// ErrBadSize reports a state or hot set Memory cannot hold.
var ErrBadSize = errors.New("bad state size")

// NewMemory allocates pages pages, writes every one at version 0 (so all
// of them are resident and random), and cycles future writes over the
// first hot of them.
func NewMemory(seed uint64, pages, hot int) (*Memory, error) {
	switch {
	case pages < 1:
		return nil, fmt.Errorf("%w: %d pages (at least one page of %d bytes)", ErrBadSize, pages, PageSize)
	case hot < 1 || hot > pages:
		return nil, fmt.Errorf("%w: hot set of %d pages out of 1..%d", ErrBadSize, hot, pages)
	}
	m := &Memory{seed: seed, hot: hot, buf: make([]byte, pages*PageSize), versions: make([]uint32, pages)}
	for i := 0; i < pages; i++ {
		FillPage(m.page(i), seed, i, 0)
	}
	return m, nil
}

func (m *Memory) page(i int) []byte { return m.buf[i*PageSize : (i+1)*PageSize] }

// Pages is the number of pages of the state.
func (m *Memory) Pages() int { return len(m.versions) }

// Hot is the number of pages the writes cycle over.
func (m *Memory) Hot() int { return m.hot }

// Seed is the seed of the page contents.
func (m *Memory) Seed() uint64 { return m.seed }

// Write dirties the next n pages of the cycle (wrapping around).
func (m *Memory) Write(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ; n > 0; n-- {
		i := m.cursor
		m.versions[i]++
		WriteStamp(m.page(i), m.seed, i, m.versions[i])
		m.writes++
		if m.cursor++; m.cursor == m.hot {
			m.cursor = 0
		}
	}
}

// Writes returns the number of writes done.
func (m *Memory) Writes() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.writes
}

// VersionAfter is the version of page i after writes sequential writes
// over a cycle of hot pages.
func VersionAfter(writes uint64, hot, i int) uint32 {
	if i >= hot {
		return 0
	}
	v := writes / uint64(hot)
	if uint64(i) < writes%uint64(hot) {
		v++
	}
	return uint32(v)
}

// Check outcomes besides OK.
const (
	BadContent = "content" // the page's bytes are not FillPage's for its version
	BadVersion = "version" // the tracked version disagrees with the write count
	BadCursor  = "cursor"  // the write position disagrees with the write count
)

// CheckResult is the outcome of verifying the whole state.
type CheckResult struct {
	Pages      int    `json:"pages"`
	VersionSum uint64 `json:"version_sum"` // Σ versions = writes when OK
	Writes     uint64 `json:"writes"`
	BadPage    int    `json:"bad_page"`         // first bad page; -1 when OK
	Reason     string `json:"reason,omitempty"` // BadContent, BadVersion or BadCursor
}

// OK reports whether every page verified.
func (r CheckResult) OK() bool { return r.BadPage < 0 && r.Reason == "" }

// Check verifies every page against (seed, index, version) and every
// version against the write count. Writes wait while it runs.
func (m *Memory) Check() CheckResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	res := CheckResult{Pages: len(m.versions), Writes: m.writes, BadPage: -1}
	if uint64(m.cursor) != m.writes%uint64(m.hot) {
		res.BadPage, res.Reason = m.cursor, BadCursor
		return res
	}
	for i, v := range m.versions {
		res.VersionSum += uint64(v)
		if res.Reason != "" {
			continue
		}
		switch {
		case v != VersionAfter(m.writes, m.hot, i):
			res.BadPage, res.Reason = i, BadVersion
		case !CheckPage(m.page(i), m.seed, i, v):
			res.BadPage, res.Reason = i, BadContent
		}
	}
	return res
}
