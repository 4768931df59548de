package linux

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file holds what package precopy needs to read a running process's
// memory without stopping it: the process tree, namespace pids, which
// pages hold anonymous data (the PAGEMAP_SCAN ioctl, or /proc/PID/pagemap
// before Linux 6.7), process_vm_readv, and hole punching for its sparse
// page store.

// ChildPIDs returns the children of every thread of pid, from
// /proc/PID/task/TID/children. A process that is gone gives an error
// wrapping fs.ErrNotExist.
func ChildPIDs(pid int) ([]int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, t := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
				continue // the thread exited
			}
			return nil, err
		}
		for _, f := range strings.Fields(string(data)) {
			c, err := strconv.Atoi(f)
			if err != nil {
				return nil, fmt.Errorf("children of %d: bad pid %q", pid, f)
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// NSPIDs returns the NSpid line of /proc/PID/status: pid's number in
// every pid namespace it belongs to, the host's first, its own last.
func NSPIDs(pid int) ([]int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "NSpid:")
		if !ok {
			continue
		}
		var out []int
		for _, s := range strings.Fields(rest) {
			n, err := strconv.Atoi(s)
			if err != nil {
				return nil, fmt.Errorf("status of %d: bad NSpid %q", pid, rest)
			}
			out = append(out, n)
		}
		if len(out) == 0 {
			break
		}
		return out, nil
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("status of %d: no NSpid line", pid)
}

// MemRange is the virtual address range [Start, End) of a process.
type MemRange struct{ Start, End uint64 }

// Len is the range's size in bytes.
func (r MemRange) Len() uint64 { return r.End - r.Start }

// PAGEMAP_SCAN (linux/fs.h, Linux ≥ 6.7).
const (
	pageIsFile    = 1 << 2
	pageIsPresent = 1 << 3
	pageIsSwapped = 1 << 4
	pageIsPFNZero = 1 << 5

	// _IOWR('f', 16, struct pm_scan_arg), sizeof(pm_scan_arg) = 96.
	ioctlPagemapScan = 0xC0606610
)

type pmScanArg struct {
	size              uint64
	flags             uint64
	start             uint64
	end               uint64
	walkEnd           uint64
	vec               uint64
	vecLen            uint64
	maxPages          uint64
	categoryInverted  uint64
	categoryMask      uint64
	categoryAnyofMask uint64
	returnMask        uint64
}

type pageRegion struct {
	start, end, categories uint64
}

// /proc/PID/pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmePresent = 1 << 63
	pmeSwapped = 1 << 62
	pmeFile    = 1 << 61 // file page or shared anonymous
)

// noPagemapScan is set once PAGEMAP_SCAN turned out to be missing.
var noPagemapScan atomic.Bool

// Pagemap is an open /proc/PID/pagemap. It is not safe for concurrent use.
type Pagemap struct {
	f       *os.File
	regions []pageRegion
	entries []uint64
}

// OpenPagemap opens pid's pagemap (root may read any process's).
func OpenPagemap(pid int) (*Pagemap, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, err
	}
	return &Pagemap{f: f}, nil
}

// Close releases the pagemap.
func (p *Pagemap) Close() error { return p.f.Close() }

// appendRange appends r to dst, merged into the last range when they
// touch.
func appendRange(dst []MemRange, r MemRange) []MemRange {
	if k := len(dst); k > 0 && dst[k-1].End == r.Start {
		dst[k-1].End = r.End
		return dst
	}
	return append(dst, r)
}

// ShmemDataRanges appends to dst the ranges of pid's shared memory
// mapping [start, end), at offset off of its shmem object (anonymous
// shared memory, System V shm, a memfd), whose pages hold data: those the
// object has in memory or swap, whether or not pid has touched them
// (SEEK_DATA on /proc/PID/map_files). CRIU dumps these; the pagemap shows
// only the pages mapped in pid's page tables, which after a restore (CRIU
// fills the object without mapping its pages in the processes) may be
// few. Adjacent pages come merged. Needs CAP_SYS_ADMIN.
func ShmemDataRanges(pid int, start, end, off uint64, dst []MemRange) ([]MemRange, error) {
	if start%4096 != 0 || end%4096 != 0 || end < start || off%4096 != 0 {
		return dst, fmt.Errorf("shmem: bad range %#x-%#x at %#x", start, end, off)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, start, end))
	if err != nil {
		return dst, err
	}
	defer f.Close()
	fd := int(f.Fd())
	limit := off + (end - start)
	for pos := off; pos < limit; {
		d, err := unix.Seek(fd, int64(pos), unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // no data at or past pos
			break
		}
		if err != nil {
			return dst, fmt.Errorf("shmem of %d at %#x: seek data: %w", pid, start, err)
		}
		if uint64(d) >= limit {
			break
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return dst, fmt.Errorf("shmem of %d at %#x: seek hole: %w", pid, start, err)
		}
		lo, hi := uint64(d)&^4095, min((uint64(h)+4095)&^4095, limit)
		if hi <= lo { // a hole at d: SEEK_DATA and SEEK_HOLE raced a change
			break
		}
		dst = appendRange(dst, MemRange{Start: start + lo - off, End: start + hi - off})
		pos = hi
	}
	return dst, nil
}

// DataRanges appends to dst the ranges of pages within [start, end) that
// hold data of their own: present or swapped out, and for a private
// mapping (shared false) neither a page-cache page of the mapped file
// (not yet copied on write) nor the shared zero page. For a shared
// anonymous mapping (shared true) every present or swapped page counts.
// This is the set of pages CRIU dumps. Adjacent pages come merged.
//
// It uses the PAGEMAP_SCAN ioctl and falls back to reading pagemap
// entries on kernels without it (the zero page is then not recognised).
func (p *Pagemap) DataRanges(start, end uint64, shared bool, dst []MemRange) ([]MemRange, error) {
	if start%4096 != 0 || end%4096 != 0 || end < start {
		return dst, fmt.Errorf("pagemap: bad range %#x-%#x", start, end)
	}
	if !noPagemapScan.Load() {
		out, err := p.scan(start, end, shared, dst)
		if !errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.EINVAL) {
			return out, err
		}
		noPagemapScan.Store(true)
	}
	return p.readEntries(start, end, shared, dst)
}

func (p *Pagemap) scan(start, end uint64, shared bool, dst []MemRange) ([]MemRange, error) {
	if p.regions == nil {
		p.regions = make([]pageRegion, 512)
	}
	arg := pmScanArg{
		size:              uint64(unsafe.Sizeof(pmScanArg{})),
		vec:               uint64(uintptr(unsafe.Pointer(&p.regions[0]))),
		vecLen:            uint64(len(p.regions)),
		categoryAnyofMask: pageIsPresent | pageIsSwapped,
		returnMask:        pageIsPresent | pageIsSwapped,
	}
	if !shared {
		arg.categoryInverted = pageIsFile | pageIsPFNZero
		arg.categoryMask = pageIsFile | pageIsPFNZero
	}
	for start < end {
		arg.start, arg.end, arg.walkEnd = start, end, 0
		n, _, errno := unix.Syscall(unix.SYS_IOCTL, p.f.Fd(), ioctlPagemapScan, uintptr(unsafe.Pointer(&arg)))
		if errno != 0 {
			return dst, fmt.Errorf("pagemap scan: %w", errno)
		}
		for _, r := range p.regions[:n] {
			dst = appendRange(dst, MemRange{r.start, r.end})
		}
		if arg.walkEnd <= start {
			return dst, fmt.Errorf("pagemap scan: no progress at %#x", start)
		}
		start = arg.walkEnd
	}
	return dst, nil
}

func (p *Pagemap) readEntries(start, end uint64, shared bool, dst []MemRange) ([]MemRange, error) {
	if p.entries == nil {
		p.entries = make([]uint64, 4096)
	}
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&p.entries[0])), len(p.entries)*8)
	for addr := start; addr < end; {
		want := min(uint64(len(p.entries)), (end-addr)/4096)
		n, err := p.f.ReadAt(buf[:want*8], int64(addr/4096*8))
		if n < 8 {
			if err == nil {
				err = fmt.Errorf("short read")
			}
			return dst, fmt.Errorf("read pagemap at %#x: %w", addr, err)
		}
		for _, e := range p.entries[:n/8] {
			keep := e&(pmePresent|pmeSwapped) != 0 && (shared || e&pmeFile == 0)
			if keep {
				dst = appendRange(dst, MemRange{addr, addr + 4096})
			}
			addr += 4096
		}
	}
	return dst, nil
}

// MaxIOV is the most ranges ReadProcessMemory takes in one call (IOV_MAX).
const MaxIOV = 1024

// ReadProcessMemory copies the ranges src of process pid, in order, into
// dst (process_vm_readv; the process keeps running). len(dst) must be at
// least the ranges' total and len(src) at most MaxIOV. It returns the
// bytes copied: fewer than asked when a range became unreadable (unmapped
// meanwhile), the copy stopping at the first byte that could not be read.
// A process that is gone gives unix.ESRCH.
func ReadProcessMemory(pid int, dst []byte, src []MemRange) (int, error) {
	if len(src) == 0 {
		return 0, nil
	}
	if len(src) > MaxIOV {
		return 0, fmt.Errorf("process_vm_readv: %d ranges exceed %d", len(src), MaxIOV)
	}
	var total uint64
	remote := make([]unix.RemoteIovec, len(src))
	for i, r := range src {
		remote[i] = unix.RemoteIovec{Base: uintptr(r.Start), Len: int(r.Len())}
		total += r.Len()
	}
	if uint64(len(dst)) < total {
		return 0, fmt.Errorf("process_vm_readv: %d-byte buffer for %d bytes", len(dst), total)
	}
	local := []unix.Iovec{{Base: &dst[0]}}
	local[0].SetLen(int(total))
	n, err := unix.ProcessVMReadv(pid, local, remote, 0)
	if err != nil {
		if errors.Is(err, unix.EFAULT) {
			return 0, nil // the first range is unreadable
		}
		return 0, fmt.Errorf("process_vm_readv %d: %w", pid, err)
	}
	return n, nil
}

// ErrNoProcess is what ReadProcessMemory's error wraps when the process is
// gone.
var ErrNoProcess = unix.ESRCH

// PunchHole deallocates n bytes of f at off (keeping its size): they read
// as zeros afterwards.
func PunchHole(f *os.File, off, n int64) error {
	if n == 0 {
		return nil
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
		return &os.PathError{Op: "punch hole", Path: f.Name(), Err: err}
	}
	return nil
}
