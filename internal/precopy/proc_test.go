package precopy

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/edgehop/edgehop/internal/linux"
)

func TestParseMapsLine(t *testing.T) {
	tests := []struct {
		line   string
		keep   bool
		shared bool
	}{
		{"7f1c2a000000-7f1c2a021000 rw-p 00000000 00:00 0 ", true, false},
		{"55d0c8a4b000-55d0c8a6c000 rw-p 00000000 00:00 0                          [heap]", true, false},
		{"7ffd1b5e0000-7ffd1b601000 rw-p 00000000 00:00 0                          [stack]", true, false},
		{"7f1c2a3f0000-7f1c2a3f2000 rw-p 001f0000 fe:01 1234  /usr/lib/x86_64-linux-gnu/libc.so.6", true, false},
		{"7f1c2a200000-7f1c2a3f0000 r-xp 00028000 fe:01 1234  /usr/lib/x86_64-linux-gnu/libc.so.6", true, false},
		{"7f1c2a021000-7f1c2a022000 ---p 00000000 00:00 0 ", false, false},
		{"7ffd1b7d0000-7ffd1b7d4000 r--p 00000000 00:00 0                          [vvar]", false, false},
		{"7ffd1b7d4000-7ffd1b7d6000 r-xp 00000000 00:00 0                          [vdso]", false, false},
		{"ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]", false, false},
		{"7f1c29000000-7f1c2a000000 rw-s 00000000 00:01 2048                       /dev/zero (deleted)", true, true},
		{"7f1c28000000-7f1c29000000 rw-s 00000000 00:01 5                          /SYSV0000002a (deleted)", true, true},
		// What CRIU restores a shared anonymous mapping as, and any memfd.
		{"417ba000-497ba000 rw-s 00000000 00:01 11491                              /memfd:/dev/zero (deleted)", true, true},
		{"7f1c26000000-7f1c27000000 rw-s 00000000 00:01 77                         /memfd:wayland-shm (deleted)", true, true},
		{"7f1c27000000-7f1c28000000 rw-s 00000000 fe:01 99                         /var/lib/data file with spaces", false, true},
	}
	for _, tt := range tests {
		m, keep, err := parseMapsLine(tt.line)
		if err != nil {
			t.Errorf("%q: %v", tt.line, err)
			continue
		}
		if keep != tt.keep || (keep && m.shared != tt.shared) {
			t.Errorf("%q: keep=%v shared=%v, want keep=%v shared=%v", tt.line, keep, m.shared, tt.keep, tt.shared)
		}
	}
	for _, bad := range []string{"", "zz-10 rw-p 0 0:0 0", "1000-0 rw-p 0 00:00 0", "1000-2000 rw 0 00:00 0", "1001-2000 rw-p 0 00:00 0"} {
		if _, _, err := parseMapsLine(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestProcessTree(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	procs, err := processTree(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if procs[0].pid != os.Getpid() {
		t.Fatalf("tree starts with %d, want this process %d", procs[0].pid, os.Getpid())
	}
	ns, err := linux.NSPIDs(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	want := process{pid: cmd.Process.Pid, nspid: uint32(ns[len(ns)-1])}
	if !slices.Contains(procs, want) {
		t.Fatalf("tree %v lacks the child %v", procs, want)
	}
	if _, err := processTree(1 << 30); err == nil {
		t.Fatal("tree of a pid that does not exist")
	}
}

// TestDataRanges checks the pages found in this process: a mapping
// written in part has exactly its written pages, an untouched one none,
// and a read one (the shared zero page) none.
func TestDataRanges(t *testing.T) {
	const n = 64
	buf, err := syscall.Mmap(-1, 0, n*PageSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(buf)
	if err := syscall.Madvise(buf, 14 /* MADV_NOHUGEPAGE */); err != nil {
		t.Fatal(err)
	}
	base := uint64(uintptr(unsafe.Pointer(&buf[0])))
	for _, i := range []int{3, 4, 5, 40} {
		buf[i*PageSize] = 1
	}
	sum := 0
	for i := 10; i < 20; i++ {
		sum += int(buf[i*PageSize]) // read only: maps the zero page
	}
	pm, err := linux.OpenPagemap(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	got, err := pm.DataRanges(base, base+n*PageSize, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []linux.MemRange{{Start: base + 3*PageSize, End: base + 6*PageSize}, {Start: base + 40*PageSize, End: base + 41*PageSize}}
	if !slices.Equal(got, want) {
		t.Fatalf("data ranges %x, want %x (sum %d)", got, want, sum)
	}
}

// TestProcessTreeChurn walks a tree whose children come and go all the
// time: a child that exits during the walk is left out, never an error.
func TestProcessTreeChurn(t *testing.T) {
	cmd := exec.Command("sh", "-c", "while :; do /bin/true; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(time.Second)
	for n := 0; time.Now().Before(deadline); n++ {
		procs, err := processTree(cmd.Process.Pid)
		if err != nil {
			t.Fatalf("walk %d: %v", n, err)
		}
		if len(procs) == 0 || procs[0].pid != cmd.Process.Pid {
			t.Fatalf("walk %d: %v does not start at the root", n, procs)
		}
	}
}

func TestExited(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("read: %w", syscall.ESRCH), true},
		{fmt.Errorf("open: %w", fs.ErrNotExist), true},
		{fmt.Errorf("read: %w", syscall.EACCES), false},
	} {
		if got := exited(tc.err); got != tc.want {
			t.Errorf("exited(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
