package linux

import (
	"os"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A shared mapping of a memfd whose pages were written through the file,
// never through the mapping, shows no page in the pagemap; ShmemDataRanges
// finds exactly the written pages, at their addresses in the mapping.
// That is the state CRIU leaves a restored service's shared memory in.
func TestShmemDataRanges(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_ADMIN) to open /proc/PID/map_files")
	}
	const pages = 64
	fd, err := unix.MemfdCreate("edgehop-test", 0)
	if err != nil {
		t.Skipf("memfd_create: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, pages*4096); err != nil {
		t.Fatal(err)
	}
	page := make([]byte, 4096)
	page[0] = 1
	for _, p := range []int64{3, 10, 11, 40} {
		if _, err := unix.Pwrite(fd, page, p*4096); err != nil {
			t.Fatal(err)
		}
	}
	// Map from page 2 of the object on: offsets are translated.
	const off = 2 * 4096
	mem, err := unix.Mmap(fd, off, (pages-2)*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	start := uint64(uintptr(unsafe.Pointer(&mem[0])))
	end := start + uint64(len(mem))

	got, err := ShmemDataRanges(os.Getpid(), start, end, off, nil)
	if err != nil {
		t.Fatal(err)
	}
	at := func(p uint64) uint64 { return start + (p*4096 - off) }
	want := []MemRange{{at(3), at(4)}, {at(10), at(12)}, {at(40), at(41)}}
	if !slices.Equal(got, want) {
		t.Fatalf("ranges %x, want %x", got, want)
	}

	pm, err := OpenPagemap(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	mapped, err := pm.DataRanges(start, end, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(mapped) != 0 {
		t.Fatalf("pagemap shows %x mapped before any access; the test needs none", mapped)
	}

	if _, err := ShmemDataRanges(os.Getpid(), start, end+4096, off, nil); err == nil {
		t.Fatal("a range that is not a mapping was accepted")
	}
}
