package precopy

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/edgehop/edgehop/internal/linux"
)

// process is one process of the tree being copied.
type process struct {
	pid   int    // in this agent's pid namespace: what the kernel calls take
	nspid uint32 // in the container's pid namespace: CRIU's image key
}

// processTree lists root and its descendants, parents first. Each gets
// its pid in root's pid namespace, which is how CRIU names its images
// (pagemap-<nspid>.img) when it dumps the tree rooted at root. Processes
// that exit during the walk are left out; root itself must exist.
func processTree(root int) ([]process, error) {
	ns, err := linux.NSPIDs(root)
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", root, err)
	}
	depth := len(ns) - 1
	out := []process{{pid: root, nspid: uint32(ns[depth])}}
	seen := map[int]bool{root: true}
	for i := 0; i < len(out); i++ {
		kids, err := linux.ChildPIDs(out[i].pid)
		if err != nil {
			if i > 0 && exited(err) {
				continue
			}
			return nil, fmt.Errorf("children of %d: %w", out[i].pid, err)
		}
		for _, k := range kids {
			if seen[k] {
				continue
			}
			seen[k] = true
			kns, err := linux.NSPIDs(k)
			if err != nil {
				if exited(err) {
					continue
				}
				return nil, fmt.Errorf("process %d: %w", k, err)
			}
			if len(kns) <= depth {
				return nil, fmt.Errorf("process %d is not in the pid namespace of %d", k, root)
			}
			out = append(out, process{pid: k, nspid: uint32(kns[depth])})
		}
	}
	return out, nil
}

// exited reports whether err says the process is gone: its /proc entry
// missing, or (exiting between open and read) ESRCH.
func exited(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, linux.ErrNoProcess)
}

// mapping is a memory mapping whose pages CRIU dumps.
type mapping struct {
	linux.MemRange
	// shared is a shared anonymous mapping (MAP_SHARED|MAP_ANONYMOUS or
	// System V shared memory), which CRIU dumps once as shmem pages.
	shared bool
	offset uint64 // in the mapped object
}

// dataMappings lists pid's mappings whose pages CRIU dumps and that can
// be read without stopping the process: readable private mappings
// (anonymous, and private file mappings, of which only the pages written
// since count) and readable shared anonymous mappings and memfds. It leaves out
// [vvar], [vdso] and [vsyscall], shared file mappings (their data is the
// file), and mappings without read permission (process_vm_readv cannot
// read them; the final round sends their pages).
func dataMappings(pid int) ([]mapping, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m, ok, err := parseMapsLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("maps of %d: %w", pid, err)
		}
		if ok {
			out = append(out, m)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("maps of %d: %w", pid, err)
	}
	return out, nil
}

// parseMapsLine parses one /proc/PID/maps line and says whether its
// mapping is one dataMappings keeps.
func parseMapsLine(line string) (mapping, bool, error) {
	// start-end perms offset dev inode [path]
	fields := strings.Fields(line)
	if len(fields) < 5 {
		return mapping{}, false, fmt.Errorf("bad line %q", line)
	}
	lo, hi, ok := strings.Cut(fields[0], "-")
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	if !ok || err1 != nil || err2 != nil || end < start || start%PageSize != 0 || end%PageSize != 0 {
		return mapping{}, false, fmt.Errorf("bad range in %q", line)
	}
	perms := fields[1]
	if len(perms) != 4 {
		return mapping{}, false, fmt.Errorf("bad permissions in %q", line)
	}
	path := strings.Join(fields[5:], " ")
	off, err := strconv.ParseUint(fields[2], 16, 64)
	if err != nil || off%PageSize != 0 {
		return mapping{}, false, fmt.Errorf("bad offset in %q", line)
	}
	m := mapping{MemRange: linux.MemRange{Start: start, End: end}, offset: off}
	if perms[0] != 'r' {
		return m, false, nil
	}
	switch path {
	case "[vvar]", "[vvar_vclock]", "[vdso]", "[vsyscall]":
		return m, false, nil
	}
	if perms[3] == 'p' {
		return m, true, nil
	}
	// Shared: only anonymous shared memory holds data of its own. CRIU
	// dumps memfd contents as shmem pages too, and restores a shared
	// anonymous mapping as a memfd ("/memfd:/dev/zero (deleted)"): a
	// service migrated once has its shared memory there.
	m.shared = true
	anon := path == "/dev/zero (deleted)" || strings.HasPrefix(path, "/SYSV") || strings.HasPrefix(path, "[anon_shmem") ||
		strings.HasPrefix(path, "/memfd:")
	return m, anon, nil
}
