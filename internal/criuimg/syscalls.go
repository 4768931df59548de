package criuimg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	x86 "github.com/checkpoint-restore/go-criu/v7/crit/images/core-x86"
	core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/magic"
	"google.golang.org/protobuf/proto"
)

// x86-64 system calls the kernel restarts through a restart block when
// they wait with a timeout.
const (
	sysPoll           = 7
	sysNanosleep      = 35
	sysFutex          = 202
	sysClockNanosleep = 230
)

// eintr is -EINTR as a register holds it.
const eintr = ^uint64(4 - 1)

// syscallInsnLen is the length of x86-64's syscall instruction (and of
// int $0x80).
const syscallInsnLen = 2

// maxCoreImage bounds a core image read: one task's registers and
// state, a few KiB.
const maxCoreImage = 4 << 20

var (
	magicCommon = uint32(magic.LoadMagic().ByName["IMG_COMMON"])
	magicCore   = uint32(magic.LoadMagic().ByName["CORE"])
)

// RestartSyscalls rewrites the core images in dir so that every task the
// dump recorded as interrupted in a restartable wait issues the same
// system call again when restored (see the package doc). It returns the
// number of tasks rewritten. An image that does not decode as a core
// image is left as it is, for CRIU to refuse with its own reason; only
// failing to read or write one is an error.
func RestartSyscalls(dir string) (int, error) {
	files, err := filepath.Glob(filepath.Join(dir, "core-*.img"))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, f := range files {
		changed, err := restartFile(f)
		if err != nil {
			return n, err
		}
		if changed {
			n++
		}
	}
	return n, nil
}

func restartFile(path string) (bool, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	if fi.Size() > maxCoreImage {
		return false, nil // not a core image this package knows: CRIU judges it
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	out, changed, err := RestartCore(b)
	if err != nil || !changed {
		// One that does not decode is CRIU's to refuse, with its reason.
		return false, nil
	}
	tmp := path + ".restart"
	if err := os.WriteFile(tmp, out, fi.Mode().Perm()); err != nil {
		return false, err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return false, err
	}
	return true, nil
}

// RestartCore is RestartSyscalls for one core image's bytes: the image
// rewritten, and whether it changed (if not, b itself).
func RestartCore(b []byte) ([]byte, bool, error) {
	if len(b) < 12 {
		return nil, false, errors.New("not a core image: too short")
	}
	if binary.LittleEndian.Uint32(b[0:4]) != magicCommon || binary.LittleEndian.Uint32(b[4:8]) != magicCore {
		return nil, false, errors.New("not a core image: wrong magic")
	}
	size := binary.LittleEndian.Uint32(b[8:12])
	if uint64(size) != uint64(len(b)-12) {
		return nil, false, fmt.Errorf("core entry of %d bytes in %d", size, len(b)-12)
	}
	var ce core.CoreEntry
	// Only three registers are read and changed; the rest is CRIU's to
	// check, so an entry missing a required field still goes through.
	if err := (proto.UnmarshalOptions{AllowPartial: true}).Unmarshal(b[12:], &ce); err != nil {
		return nil, false, fmt.Errorf("core entry: %w", err)
	}
	if !restart(&ce) {
		return b, false, nil
	}
	entry, err := (proto.MarshalOptions{AllowPartial: true}).Marshal(&ce)
	if err != nil {
		return nil, false, err
	}
	out := make([]byte, 12, 12+len(entry))
	copy(out, b[:8])
	binary.LittleEndian.PutUint32(out[8:12], uint32(len(entry)))
	return append(out, entry...), true, nil
}

// restart turns a restartable wait recorded as interrupted into the same
// call issued again, and reports whether it did.
func restart(ce *core.CoreEntry) bool {
	if ce.GetMtype() != core.CoreEntry_X86_64 {
		return false
	}
	g := ce.GetThreadInfo().GetGpregs()
	if g == nil || g.GetMode() != x86.UserX86RegsMode_NATIVE || g.OrigAx == nil || g.Ax == nil || g.Ip == nil {
		return false
	}
	if g.GetAx() != eintr || g.GetIp() < syscallInsnLen {
		return false
	}
	switch g.GetOrigAx() {
	case sysPoll, sysNanosleep, sysFutex, sysClockNanosleep:
	default:
		return false
	}
	g.Ax = proto.Uint64(g.GetOrigAx())
	g.Ip = proto.Uint64(g.GetIp() - syscallInsnLen)
	return true
}
