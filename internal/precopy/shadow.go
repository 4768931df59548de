package precopy

import "encoding/binary"

// DefaultShadowBytes bounds the memory a Source keeps of pages it sent
// (Config.ShadowBytes).
const DefaultShadowBytes = 256 << 20

// shadowPage is the content the destination holds at refs addresses,
// and its hash.
type shadowPage struct {
	hash uint64
	// hot pages were sent again after the first round.
	hot  bool
	refs int
	data [PageSize]byte
}

// shadows keeps the source's copy of the pages it sent, up to a bound.
// When such a page changes, the source sends its XOR with the copy, which
// the destination applies to the page it holds: a request that rewrote
// some words of a page leaves a page of zeros but for those words, which
// the stream's compression crushes. A page sent as a copy of another
// shares that one's copy (forked workers hold most of their memory in
// common). Pages that changed after the first round (hot) come first:
// once the bound is reached, a hot page takes the place of a first-round
// page that never changed since.
type shadows struct {
	max   int // pages allocated at most
	n     int // pages allocated
	pages map[pageLoc]*shadowPage
	free  []*shadowPage
	// cold lists the first round's addresses in the order kept; an
	// entry may since have gone or turned hot.
	cold []pageLoc
}

func newShadows(bytes int64) *shadows {
	return &shadows{max: int(max(bytes, 0) / PageSize), pages: map[pageLoc]*shadowPage{}}
}

// get returns the page kept for loc if the destination holds it there
// now (held is the hash the source knows it holds).
func (s *shadows) get(loc pageLoc, held uint64) []byte {
	p, ok := s.pages[loc]
	if !ok || p.hash != held {
		return nil
	}
	return p.data[:]
}

// put records that the destination now holds data, hashed h, at loc:
// hot after the first round. It keeps nothing once the bound is reached
// and no first-round page can make way.
func (s *shadows) put(loc pageLoc, h uint64, data []byte, hot bool) {
	if p, ok := s.pages[loc]; ok && p.refs == 1 {
		p.hash, p.hot = h, p.hot || hot
		copy(p.data[:], data)
		return
	}
	s.drop(loc) // shared with other addresses, which keep it
	p := s.slot(hot)
	if p == nil {
		return
	}
	*p = shadowPage{hash: h, hot: hot, refs: 1}
	copy(p.data[:], data)
	s.add(loc, p)
}

// share records that the destination now holds at loc a copy of what it
// holds at src, hashed h.
func (s *shadows) share(loc, src pageLoc, h uint64) {
	s.drop(loc)
	if p, ok := s.pages[src]; ok && p.hash == h {
		p.refs++
		s.add(loc, p)
	}
}

func (s *shadows) add(loc pageLoc, p *shadowPage) {
	s.pages[loc] = p
	if !p.hot {
		s.cold = append(s.cold, loc)
	}
}

// drop forgets loc's page.
func (s *shadows) drop(loc pageLoc) {
	p, ok := s.pages[loc]
	if !ok {
		return
	}
	delete(s.pages, loc)
	if p.refs--; p.refs == 0 {
		s.free = append(s.free, p)
	}
}

// slot returns a page to keep another in: a free one, a new one within
// the bound, or for a hot page one that only cold addresses used; nil if
// none.
func (s *shadows) slot(hot bool) *shadowPage {
	for {
		switch {
		case len(s.free) > 0:
			p := s.free[len(s.free)-1]
			s.free = s.free[:len(s.free)-1]
			return p
		case s.n < s.max:
			s.n++
			return new(shadowPage)
		case !hot || len(s.cold) == 0:
			return nil
		}
		// Forget cold addresses until a page is free.
		loc := s.cold[len(s.cold)-1]
		s.cold = s.cold[:len(s.cold)-1]
		if p, ok := s.pages[loc]; ok && !p.hot {
			s.drop(loc)
		}
	}
}

// xorIfWorth sets x to the XOR of pages a and b and reports whether it
// is worth sending instead of a: at most a quarter of its 8-byte words
// are not zero. A page rewritten with other content compresses better as
// it is than XORed with its old self (measured on WordPress's pages
// under load: a quarter sent 3 % fewer bytes than a half, 4–6 % fewer
// than an eighth). It stops as soon as the answer is no, leaving x
// partly written. One pass over a and b: the final delta runs it on
// every changed page inside the frozen window.
func xorIfWorth(x, a, b []byte) bool {
	x, b = x[:len(a)], b[:len(a)]
	limit := len(a) / 32
	for i := 0; i+8 <= len(a); i += 8 {
		w := binary.LittleEndian.Uint64(a[i:]) ^ binary.LittleEndian.Uint64(b[i:])
		binary.LittleEndian.PutUint64(x[i:], w)
		if w != 0 {
			if limit == 0 {
				return false
			}
			limit--
		}
	}
	return true
}
