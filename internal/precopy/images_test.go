package precopy

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/edgehop/edgehop/internal/criuimg"
	"google.golang.org/protobuf/encoding/protowire"
)

// pmEntry is a pagemap entry to write; old writes the page count in
// field 2 only (CRIU < 4), as CRIU 4 keeps it for old images.
type pmEntry struct {
	addr, pages, flags uint64
	noFlags, old       bool
}

// writePagemap writes a CRIU pagemap image.
func writePagemap(t testing.TB, path string, pagesID uint64, entries []pmEntry) {
	t.Helper()
	b := binary.LittleEndian.AppendUint32(nil, criuimg.ImgCommonMagic)
	b = binary.LittleEndian.AppendUint32(b, criuimg.PagemapMagic)
	msg := func(m []byte) {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m)))
		b = append(b, m...)
	}
	msg(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), pagesID))
	for _, e := range entries {
		var m []byte
		m = protowire.AppendVarint(protowire.AppendTag(m, 1, protowire.VarintType), e.addr)
		if e.old {
			m = protowire.AppendVarint(protowire.AppendTag(m, 2, protowire.VarintType), e.pages)
		} else {
			m = protowire.AppendVarint(protowire.AppendTag(m, 2, protowire.VarintType), 0)
		}
		if !e.noFlags {
			m = protowire.AppendVarint(protowire.AppendTag(m, 4, protowire.VarintType), e.flags)
		}
		if !e.old {
			m = protowire.AppendVarint(protowire.AppendTag(m, 5, protowire.VarintType), e.pages)
		}
		msg(m)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func writePages(t testing.TB, path string, pages int) {
	t.Helper()
	if err := os.WriteFile(path, make([]byte, pages*PageSize), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadImages(t *testing.T) {
	dir := t.TempDir()
	const a = 0x7f0000000000
	// Process 1: two adjacent entries (merged), a lazy-only entry (not
	// in the image) and an old-format entry.
	writePagemap(t, filepath.Join(dir, "pagemap-1.img"), 1, []pmEntry{
		{addr: a, pages: 2, flags: pePresent | 2},
		{addr: a + 2*PageSize, pages: 1, flags: pePresent},
		{addr: a + 10*PageSize, pages: 5, flags: 2},
		{addr: a + 20*PageSize, pages: 3, old: true, noFlags: true},
	})
	writePages(t, filepath.Join(dir, "pages-1.img"), 6)
	// Shared memory: pages without a process address.
	writePagemap(t, filepath.Join(dir, "pagemap-shmem-77.img"), 2, []pmEntry{{addr: 0, pages: 2, flags: pePresent}})
	writePages(t, filepath.Join(dir, "pages-2.img"), 2)
	// Process 9's pagemap disagrees with its image; pages-4 has none.
	writePagemap(t, filepath.Join(dir, "pagemap-9.img"), 3, []pmEntry{{addr: a, pages: 7, flags: pePresent}})
	writePages(t, filepath.Join(dir, "pages-3.img"), 2)
	writePages(t, filepath.Join(dir, "pages-4.img"), 1)
	os.WriteFile(filepath.Join(dir, "core-1.img"), []byte("x"), 0o644)

	var warnings int
	images, err := readImages(dir, func(string, ...any) { warnings++ })
	if err != nil {
		t.Fatal(err)
	}
	if warnings != 2 {
		t.Errorf("%d warnings, want 2 (pages-3 and pages-4)", warnings)
	}
	want := map[uint64][]pageRun{
		1: {{pid: 1, addr: a, count: 3}, {pid: 1, addr: a + 20*PageSize, count: 3}},
		2: {{pid: 0, addr: 0, count: 2}},
		3: nil,
		4: nil,
	}
	var ids []uint64
	for _, im := range images {
		ids = append(ids, im.id)
		if !slices.Equal(im.runs, want[im.id]) {
			t.Errorf("pages-%d runs %v, want %v", im.id, im.runs, want[im.id])
		}
	}
	if !slices.Equal(ids, []uint64{1, 2, 3, 4}) {
		t.Errorf("images %v, want 1..4 in order", ids)
	}
}

func TestReadImagesRejects(t *testing.T) {
	tests := map[string]func(dir string){
		"ragged pages image": func(dir string) {
			os.WriteFile(filepath.Join(dir, "pages-1.img"), make([]byte, PageSize+1), 0o644)
		},
		"not a pagemap": func(dir string) {
			os.WriteFile(filepath.Join(dir, "pagemap-1.img"), []byte("garbage!"), 0o644)
		},
		"two pagemaps for one image": func(dir string) {
			writePagemap(t, filepath.Join(dir, "pagemap-1.img"), 1, nil)
			writePagemap(t, filepath.Join(dir, "pagemap-2.img"), 1, nil)
		},
		"unaligned address": func(dir string) {
			writePagemap(t, filepath.Join(dir, "pagemap-1.img"), 1, []pmEntry{{addr: 5, pages: 1, flags: pePresent}})
		},
		"truncated entry": func(dir string) {
			writePagemap(t, filepath.Join(dir, "pagemap-1.img"), 1, []pmEntry{{addr: 0x1000, pages: 1, flags: pePresent}})
			p := filepath.Join(dir, "pagemap-1.img")
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)-2], 0o644)
		},
	}
	for name, setup := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			setup(dir)
			if _, err := readImages(dir, func(string, ...any) {}); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestLazyRuns(t *testing.T) {
	dir := t.TempDir()
	const a = 0x7f0000000000
	writePagemap(t, filepath.Join(dir, "pagemap-1.img"), 1, []pmEntry{
		{addr: a, pages: 2, flags: pePresent},                        // in the image
		{addr: a + 4*PageSize, pages: 3, flags: peLazy},              // lazy
		{addr: a + 7*PageSize, pages: 2, flags: peLazy},              // adjacent: joined
		{addr: a + 20*PageSize, pages: 1, flags: peLazy | pePresent}, // lazy but in the image
		{addr: a + 30*PageSize, pages: 4, old: true, noFlags: true},
	})
	writePagemap(t, filepath.Join(dir, "pagemap-shmem-77.img"), 2, []pmEntry{{addr: 0, pages: 2, flags: peLazy}})
	writePagemap(t, filepath.Join(dir, "pagemap-9.img"), 3, []pmEntry{{addr: a, pages: 1, flags: peLazy}})
	runs, err := LazyRuns(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(runs, func(x, y LazyRun) int { return cmp.Compare(x.PID, y.PID) })
	want := []LazyRun{{PID: 1, Addr: a + 4*PageSize, Pages: 5}, {PID: 9, Addr: a, Pages: 1}}
	if !slices.Equal(runs, want) {
		t.Fatalf("LazyRuns = %+v, want %+v", runs, want)
	}
}

func TestIsMemoryImage(t *testing.T) {
	for name, want := range map[string]bool{
		"pages-1.img": true, "pagemap-12.img": true, "pagemap-shmem-3.img": true,
		"pages-.img": false, "pagemap-1.img.tmp": false, "core-1.img": false,
		"mm-1.img": false, "pages-x.img": false, "inventory.img": false,
	} {
		if got := IsMemoryImage(name); got != want {
			t.Errorf("IsMemoryImage(%q) = %v, want %v", name, got, want)
		}
	}
}

// memoryOf reads the pages the pagemap image name in dir describes, as
// CRIU's restore does: present pages from its pages image in order,
// PE_PARENT pages from the same pagemap in dir/parent, at their address.
func memoryOf(t testing.TB, dir string, name string) map[uint64][]byte {
	t.Helper()
	out := map[uint64][]byte{}
	walkPagemap(t, dir, name, func(vaddr, nr, flags uint64, read func(i uint64) []byte) bool {
		for i := range nr {
			switch {
			case flags&pePresent != 0:
				out[vaddr+i*PageSize] = read(i)
			case flags&peParent != 0:
				out[vaddr+i*PageSize] = parentPage(t, filepath.Join(dir, ParentDir), name, vaddr+i*PageSize)
			}
		}
		return true
	})
	return out
}

// parentPage reads the page at addr from the pagemap image name in dir.
func parentPage(t testing.TB, dir, name string, addr uint64) []byte {
	t.Helper()
	var page []byte
	walkPagemap(t, dir, name, func(vaddr, nr, flags uint64, read func(i uint64) []byte) bool {
		if addr < vaddr || addr >= vaddr+nr*PageSize {
			return true
		}
		if flags&pePresent == 0 {
			t.Fatalf("%s/%s: %#x is not present", dir, name, addr)
		}
		page = read((addr - vaddr) / PageSize)
		return false
	})
	if page == nil {
		t.Fatalf("%s/%s has no page at %#x", dir, name, addr)
	}
	return page
}

// walkPagemap calls fn for each entry of the pagemap image name in dir,
// with a reader of the entry's i-th page from its pages image (present
// entries only), until fn returns false.
func walkPagemap(t testing.TB, dir, name string, fn func(vaddr, nr, flags uint64, read func(i uint64) []byte) bool) {
	t.Helper()
	buf, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	pm, err := criuimg.DecodePagemap(buf)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	pages, err := os.Open(filepath.Join(dir, fmt.Sprintf("pages-%d.img", pm.PagesID)))
	if err != nil {
		t.Fatal(err)
	}
	defer pages.Close()
	var off uint64
	errStop := errors.New("stop")
	err = pm.Entries(func(_ int, e criuimg.PagemapEntry) error {
		vaddr, nr, flags := e.Vaddr, e.Pages, e.Flags
		base := off
		read := func(i uint64) []byte {
			p := make([]byte, PageSize)
			if _, err := pages.ReadAt(p, int64(base+i*PageSize)); err != nil {
				t.Fatalf("%s: page %d: %v", name, base/PageSize+i, err)
			}
			return p
		}
		if !fn(vaddr, nr, flags, read) {
			return errStop
		}
		if flags&pePresent != 0 {
			off += nr * PageSize
		}
		return nil
	})
	if err != nil && err != errStop {
		t.Fatal(err)
	}
}

// BenchmarkReadPagemap decodes a fragmented process's pagemap (4096
// entries, every other one present), as the frozen window's sweep does.
func BenchmarkReadPagemap(b *testing.B) {
	path := filepath.Join(b.TempDir(), "pagemap-1.img")
	var es []pmEntry
	for i := range uint64(4096) {
		flags := uint64(peLazy | pePresent)
		if i%2 == 1 {
			flags = peLazy | peParent
		}
		es = append(es, pmEntry{addr: 0x7f0000000000 + i*8*PageSize, pages: 4, flags: flags})
	}
	writePagemap(b, path, 1, es)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := readPagemap(path, 1); err != nil {
			b.Fatal(err)
		}
	}
}
