package criuimg

import (
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// CRIU image magics (criu/include/magic.h).
const (
	ImgCommonMagic = 0x54564319 // precedes the magic of most images
	PagemapMagic   = 0x56084025
)

// Pagemap entry flags (criu/include/pagemap.h).
const (
	PageInParent = 1 << 0 // PE_PARENT: the pages are in a parent image
	PageLazy     = 1 << 1 // PE_LAZY: may be restored lazily (set in every dump)
	PagePresent  = 1 << 2 // PE_PRESENT: the pages are in this dump's pages image
)

// ErrNotPagemap is what DecodePagemap's error wraps when the image does
// not start with a pagemap's magics.
var ErrNotPagemap = errors.New("not a criu pagemap image")

// Pagemap is a pagemap image (pagemap-<pid>.img, pagemap-shmem-<id>.img)
// split into its head and its still encoded entries. Its slices alias the
// image it was decoded from.
type Pagemap struct {
	PagesID uint64 // the pages image, pages-<id>.img, holding the present pages
	Magic   []byte // the image's two magics, as read
	Head    []byte // the encoded pagemap_head
	entries []byte // the size-prefixed pagemap_entry messages
}

// PagemapEntry is one pagemap_entry (images/pagemap.proto): a run of
// Pages pages at Vaddr.
type PagemapEntry struct {
	Vaddr uint64
	Pages uint64 // nr_pages (field 5, CRIU 4), or compat_nr_pages (field 2) without it
	// Flags are the entry's flags; an entry of a CRIU without them
	// (no field 4) gets PagePresent, or PageInParent when InParent, as
	// CRIU's init_compat_pagemap_entry gives it.
	Flags    uint64
	HasFlags bool // the entry has field 4
	InParent bool // the deprecated in_parent field (3) is set
	Msg      []byte
}

// DecodePagemap splits a pagemap image: the common magic, the pagemap
// magic, then 32-bit-size-prefixed protobufs, a pagemap_head (pages_id =
// 1) and one pagemap_entry per run of pages. It checks the framing of
// every entry but decodes only the head; Entries decodes the entries.
func DecodePagemap(img []byte) (Pagemap, error) {
	if len(img) < 8 || binary.LittleEndian.Uint32(img) != ImgCommonMagic ||
		binary.LittleEndian.Uint32(img[4:]) != PagemapMagic {
		return Pagemap{}, ErrNotPagemap
	}
	pm := Pagemap{Magic: img[:8]}
	for b, i := img[8:], 0; len(b) > 0; i++ {
		if len(b) < 4 {
			return Pagemap{}, errors.New("truncated entry size")
		}
		size := binary.LittleEndian.Uint32(b)
		if uint64(size) > uint64(len(b)-4) {
			return Pagemap{}, fmt.Errorf("entry of %d bytes overruns the image", size)
		}
		if i == 0 {
			pm.Head = b[4 : 4+size]
			pm.entries = b[4+size:]
		}
		b = b[4+size:]
	}
	if pm.Head == nil {
		return Pagemap{}, errors.New("no pagemap head")
	}
	var err error
	pm.PagesID, err = decodeHead(pm.Head)
	if err != nil {
		return Pagemap{}, fmt.Errorf("head: %w", err)
	}
	return pm, nil
}

// Entries calls fn with each entry in the image's order, until fn
// returns an error, which Entries returns; an entry that does not decode
// stops it with an error naming the entry (the first is 0).
func (pm Pagemap) Entries(fn func(i int, e PagemapEntry) error) error {
	b := pm.entries // framing checked by DecodePagemap
	for i := 0; len(b) > 0; i++ {
		size := binary.LittleEndian.Uint32(b)
		m := b[4 : 4+size]
		b = b[4+size:]
		e, err := decodeEntry(m)
		if err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
		if err := fn(i, e); err != nil {
			return err
		}
	}
	return nil
}

// decodeHead reads pagemap_head's pages_id (field 1).
func decodeHead(b []byte) (uint64, error) {
	var id uint64
	err := varints(b, func(num protowire.Number, v uint64) {
		if num == 1 {
			id = v
		}
	})
	return id, err
}

// decodeEntry decodes pagemap_entry field by field, because CRIU 4 moved
// the page count to field 5 (nr_pages, uint64), keeping field 2
// (compat_nr_pages) for old images, and go-criu v7.2.0's generated type
// knows only field 2: vaddr = 1, compat_nr_pages = 2, in_parent = 3,
// flags = 4, nr_pages = 5.
func decodeEntry(m []byte) (PagemapEntry, error) {
	e := PagemapEntry{Msg: m}
	var compat uint64
	hasNr := false
	err := varints(m, func(num protowire.Number, v uint64) {
		switch num {
		case 1:
			e.Vaddr = v
		case 2:
			compat = v
		case 3:
			e.InParent = v != 0
		case 4:
			e.Flags, e.HasFlags = v, true
		case 5:
			e.Pages, hasNr = v, true
		}
	})
	if err != nil {
		return PagemapEntry{}, err
	}
	if !hasNr {
		e.Pages = compat
	}
	if !e.HasFlags {
		e.Flags = PagePresent
		if e.InParent {
			e.Flags = PageInParent
		}
	}
	return e, nil
}

// varints calls fn with each varint field of the protobuf message b, in
// order; fields of other wire types are skipped.
func varints(b []byte, fn func(num protowire.Number, v uint64)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.VarintType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		fn(num, v)
	}
	return nil
}

// AppendPagemapHead starts a pagemap image whose pages image is
// pages-<id>.img: the magics and the head.
func AppendPagemapHead(b []byte, id uint64) []byte {
	b = binary.LittleEndian.AppendUint32(b, ImgCommonMagic)
	b = binary.LittleEndian.AppendUint32(b, PagemapMagic)
	return AppendPagemapMessage(b, protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), id))
}

// AppendPagemapEntry appends a pagemap entry as CRIU 4 writes one:
// vaddr, a zero compat_nr_pages, flags and nr_pages.
func AppendPagemapEntry(b []byte, vaddr, pages, flags uint64) []byte {
	var m []byte
	for _, f := range []struct {
		n protowire.Number
		v uint64
	}{{1, vaddr}, {2, 0}, {4, flags}, {5, pages}} {
		m = protowire.AppendVarint(protowire.AppendTag(m, f.n, protowire.VarintType), f.v)
	}
	return AppendPagemapMessage(b, m)
}

// AppendPagemapMessage appends a 32-bit-size-prefixed message (a head or
// an entry's Msg).
func AppendPagemapMessage(b, m []byte) []byte {
	return append(binary.LittleEndian.AppendUint32(b, uint32(len(m))), m...)
}
