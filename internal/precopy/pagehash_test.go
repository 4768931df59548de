package precopy

import (
	"bytes"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestPageHasherKeyed: a page's hash depends on the migration's key, so
// the author of a page (a client of the service) cannot aim it at the
// hash of a page the destination holds; under one key it is stable, and
// the seed that travels yields the same hasher.
func TestPageHasherKeyed(t *testing.T) {
	a, b := newPageHasher(), newPageHasher()
	if a.seed == b.seed {
		t.Fatal("two migrations drew the same key")
	}
	p := filled(3)
	if a.sum(p) != a.sum(bytes.Clone(p)) {
		t.Fatal("one key hashes one page two ways")
	}
	if a.sum(p) == b.sum(p) {
		t.Fatal("the page hashes alike under two keys")
	}
	if a.sum(p) == xxhash.Sum64(p) {
		t.Fatal("the keyed hash is the public xxhash64")
	}
	k0, k1 := a.words()
	c := pageHasherOf(seedOf(k0, k1))
	if c.key != a.key || c.sum(p) != a.sum(p) {
		t.Fatal("the seed read back gives another hasher")
	}
	q := filled(4)
	if a.sum(p) == a.sum(q) {
		t.Fatal("two pages hash alike")
	}
}
