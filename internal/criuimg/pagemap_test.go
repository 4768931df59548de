package criuimg

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// oldEntry is an entry as a CRIU before 4 writes it: no flags, the page
// count in compat_nr_pages.
func oldEntry(b []byte, vaddr, pages uint64, inParent bool) []byte {
	m := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), vaddr)
	m = protowire.AppendVarint(protowire.AppendTag(m, 2, protowire.VarintType), pages)
	if inParent {
		m = protowire.AppendVarint(protowire.AppendTag(m, 3, protowire.VarintType), 1)
	}
	return AppendPagemapMessage(b, m)
}

func TestDecodePagemap(t *testing.T) {
	img := AppendPagemapHead(nil, 7)
	img = AppendPagemapEntry(img, 0x400000, 3, PageLazy|PagePresent)
	img = oldEntry(img, 0x500000, 2, false)
	img = oldEntry(img, 0x600000, 1, true)
	pm, err := DecodePagemap(img)
	if err != nil {
		t.Fatal(err)
	}
	if pm.PagesID != 7 {
		t.Errorf("pages id %d, want 7", pm.PagesID)
	}
	var got []PagemapEntry
	if err := pm.Entries(func(_ int, e PagemapEntry) error { got = append(got, e); return nil }); err != nil {
		t.Fatal(err)
	}
	want := []PagemapEntry{
		{Vaddr: 0x400000, Pages: 3, Flags: PageLazy | PagePresent, HasFlags: true},
		{Vaddr: 0x500000, Pages: 2, Flags: PagePresent},
		{Vaddr: 0x600000, Pages: 1, Flags: PageInParent, InParent: true},
	}
	if len(got) != len(want) {
		t.Fatalf("%d entries, want %d", len(got), len(want))
	}
	for i := range want {
		got[i].Msg = nil
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("entry %d: %+v, want %+v", i, got[i], want[i])
		}
	}

	for name, bad := range map[string][]byte{
		"no magic":        []byte("garbage!"),
		"no head":         img[:8],
		"truncated size":  append(bytes.Clone(img), 1, 0),
		"overrun":         img[:len(img)-1],
		"malformed entry": AppendPagemapMessage(AppendPagemapHead(nil, 1), []byte{0x08}),
	} {
		pm, err := DecodePagemap(bad)
		if err == nil {
			err = pm.Entries(func(int, PagemapEntry) error { return nil })
		}
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := DecodePagemap([]byte("garbage!")); !errors.Is(err, ErrNotPagemap) {
		t.Errorf("garbage: %v, want ErrNotPagemap", err)
	}
}

// FuzzPagemap decodes arbitrary pagemap images: it never panics, the
// head and entries it returns are the image's messages in order (they
// re-frame into the image), and each entry agrees with go-criu's
// generated decoder wherever that one accepts the message.
func FuzzPagemap(f *testing.F) {
	img := AppendPagemapHead(nil, 1)
	img = AppendPagemapEntry(img, 0x400000, 3, PagePresent)
	img = oldEntry(img, 0x403000, 2, false)
	img = oldEntry(img, 0x405000, 1, true)
	f.Add(img)
	f.Add(AppendPagemapEntry(AppendPagemapHead(nil, 2), 0x401000, 2, PageLazy))
	f.Fuzz(func(t *testing.T, in []byte) {
		pm, err := DecodePagemap(in)
		if err != nil {
			return
		}
		out := AppendPagemapMessage(bytes.Clone(pm.Magic), pm.Head)
		err = pm.Entries(func(i int, e PagemapEntry) error {
			out = AppendPagemapMessage(out, e.Msg)
			if !e.HasFlags && e.Flags != PagePresent && e.Flags != PageInParent {
				t.Fatalf("entry %d: flags %#x without a flags field", i, e.Flags)
			}
			var ref pagemap.PagemapEntry
			if proto.Unmarshal(e.Msg, &ref) != nil {
				return nil
			}
			if ref.GetVaddr() != e.Vaddr || ref.GetInParent() != e.InParent ||
				(e.HasFlags && ref.GetFlags() != uint32(e.Flags)) {
				t.Fatalf("entry %d: %+v, go-criu decodes %v", i, e, &ref)
			}
			if _, has5 := fieldOf(e.Msg, 5); !has5 && ref.GetNrPages() != uint32(e.Pages) {
				t.Fatalf("entry %d: %d pages, go-criu decodes %d", i, e.Pages, ref.GetNrPages())
			}
			return nil
		})
		if err != nil {
			return
		}
		if !bytes.Equal(out, in) {
			t.Fatalf("head and entries re-frame into %x, not the image %x", out, in)
		}
	})
}

// fieldOf reports whether message m has varint field num.
func fieldOf(m []byte, num protowire.Number) (uint64, bool) {
	var v uint64
	found := false
	_ = varints(m, func(n protowire.Number, x uint64) {
		if n == num {
			v, found = x, true
		}
	})
	return v, found
}
