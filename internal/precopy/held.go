package precopy

import "sync"

// HoldsPage reports whether the destination holds page, the content of
// pid's memory at addr, at that very address according to the rounds sent
// so far. For post-copy after live rounds (hybrid): the lazy pages the
// destination already has need not cross the network again. Once the
// rounds are over it may be called from several goroutines at once.
func (s *Source) HoldsPage(pid uint32, addr uint64, page []byte) bool {
	if len(page) != PageSize || addr%PageSize != 0 {
		return false
	}
	h, ok := s.held[pid][addr/PageSize]
	return ok && h == s.hash.sum(page)
}

// readMu serialises ReadHeldPage: Store's files map is not safe for
// concurrent use.
var readMu sync.Mutex

// ReadHeldPage reads into buf (one page) the content the store holds at
// addr of pid: what a Source's HoldsPage vouched for. Once the rounds are
// over it may be called from several goroutines at once.
func (s *Store) ReadHeldPage(pid uint32, addr uint64, buf []byte) error {
	readMu.Lock()
	defer readMu.Unlock()
	return s.read(pid, addr, buf[:PageSize])
}
