package precopy

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"

	"github.com/minio/highwayhash"
)

// pageHasher hashes pages under a secret key (HighwayHash-64, a keyed
// pseudo-random function).
//
// The source skips a page when its hash equals that of the page the
// destination holds, and sends a page as a copy of another with the same
// hash; the destination checks each rebuilt pages image by a digest of
// its pages' hashes. The service's memory holds what its clients send it,
// so with a public hash (xxhash64, say) a client could craft a page whose
// hash collides with one the destination holds: the page would not
// cross, the digest would still agree, and the service would resume with
// the old content. Under a key the client never sees, a collision is a
// 2^-64 chance. The source draws the key for each migration and sends it
// to the destination in the final delta's begin record, over the agents'
// authenticated connection.
type pageHasher struct {
	seed [16]byte // what travels
	key  [32]byte // HighwayHash's key: SHA-256 of seed
}

// newPageHasher returns a hasher under a fresh random key.
func newPageHasher() pageHasher {
	var seed [16]byte
	_, _ = rand.Read(seed[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return pageHasherOf(seed)
}

// pageHasherOf returns the hasher for a seed read from a begin record.
func pageHasherOf(seed [16]byte) pageHasher {
	return pageHasher{seed: seed, key: sha256.Sum256(seed[:])}
}

// sum hashes one page.
func (h *pageHasher) sum(page []byte) uint64 {
	return highwayhash.Sum64(page, h.key[:])
}

// words returns the seed as the two words of a begin record (addr,
// saddr); seedOf reverses it.
func (h *pageHasher) words() (uint64, uint64) {
	return binary.LittleEndian.Uint64(h.seed[:8]), binary.LittleEndian.Uint64(h.seed[8:])
}

func seedOf(addr, saddr uint64) [16]byte {
	var s [16]byte
	binary.LittleEndian.PutUint64(s[:8], addr)
	binary.LittleEndian.PutUint64(s[8:], saddr)
	return s
}

// roundBegin is the begin record of round n, carrying the hasher's seed:
// the destination hashes the pages it stores under the same key.
func roundBegin(h *pageHasher, n int) record {
	k0, k1 := h.words()
	return record{typ: recBegin, count: version, pid: kindRound, spid: uint32(n), addr: k0, saddr: k1}
}
