package criuimg

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	x86 "github.com/checkpoint-restore/go-criu/v7/crit/images/core-x86"
	core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"google.golang.org/protobuf/proto"
)

// coreImage is a core image as CRIU writes it: a task of march stopped
// at a system call's exit (orig_ax, ax) with its instruction pointer at
// ip.
func coreImage(t testing.TB, march core.CoreEntryMarch, mode x86.UserX86RegsMode, origAx, ax, ip uint64) []byte {
	t.Helper()
	ce := &core.CoreEntry{Mtype: march.Enum(), ThreadInfo: &x86.ThreadInfoX86{
		Gpregs: &x86.UserX86RegsEntry{OrigAx: proto.Uint64(origAx), Ax: proto.Uint64(ax), Ip: proto.Uint64(ip), Mode: mode.Enum(),
			R15: proto.Uint64(1), R14: proto.Uint64(2), R13: proto.Uint64(3), R12: proto.Uint64(4), Bp: proto.Uint64(5), Bx: proto.Uint64(6),
			R11: proto.Uint64(7), R10: proto.Uint64(8), R9: proto.Uint64(9), R8: proto.Uint64(10), Cx: proto.Uint64(11), Dx: proto.Uint64(12),
			Si: proto.Uint64(13), Di: proto.Uint64(14), Cs: proto.Uint64(15), Flags: proto.Uint64(16), Sp: proto.Uint64(17), Ss: proto.Uint64(18),
			FsBase: proto.Uint64(19), GsBase: proto.Uint64(20), Ds: proto.Uint64(21), Es: proto.Uint64(22), Fs: proto.Uint64(23), Gs: proto.Uint64(24)},
		ClearTidAddr: proto.Uint64(0)}}
	entry, err := (proto.MarshalOptions{AllowPartial: true}).Marshal(ce)
	if err != nil {
		t.Fatal(err)
	}
	b := binary.LittleEndian.AppendUint32(nil, magicCommon)
	b = binary.LittleEndian.AppendUint32(b, magicCore)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(entry)))
	return append(b, entry...)
}

func regs(t *testing.T, b []byte) *x86.UserX86RegsEntry {
	t.Helper()
	var ce core.CoreEntry
	if err := (proto.UnmarshalOptions{AllowPartial: true}).Unmarshal(b[12:], &ce); err != nil {
		t.Fatal(err)
	}
	if int(binary.LittleEndian.Uint32(b[8:12])) != len(b)-12 {
		t.Fatalf("entry size %d in %d bytes", binary.LittleEndian.Uint32(b[8:12]), len(b)-12)
	}
	return ce.GetThreadInfo().GetGpregs()
}

func TestRestartCore(t *testing.T) {
	const ip = 0x7f0000001234
	for _, nr := range []uint64{sysPoll, sysNanosleep, sysFutex, sysClockNanosleep} {
		out, changed, err := RestartCore(coreImage(t, core.CoreEntry_X86_64, x86.UserX86RegsMode_NATIVE, nr, eintr, ip))
		if err != nil || !changed {
			t.Fatalf("syscall %d: changed %v, %v", nr, changed, err)
		}
		g := regs(t, out)
		if g.GetAx() != nr || g.GetOrigAx() != nr || g.GetIp() != ip-2 {
			t.Errorf("syscall %d: ax %d orig_ax %d ip %#x, want the call again at %#x", nr, g.GetAx(), g.GetOrigAx(), g.GetIp(), ip-2)
		}
		if g.GetDi() != 14 || g.GetSi() != 13 || g.GetDx() != 12 || g.GetR10() != 8 || g.GetSp() != 17 {
			t.Errorf("syscall %d: the call's arguments or stack changed: %v", nr, g)
		}
	}
	for name, img := range map[string][]byte{
		"epoll_wait's own EINTR":   coreImage(t, core.CoreEntry_X86_64, x86.UserX86RegsMode_NATIVE, 232, eintr, ip),
		"poll that returned":       coreImage(t, core.CoreEntry_X86_64, x86.UserX86RegsMode_NATIVE, sysPoll, 1, ip),
		"accept to be restarted":   coreImage(t, core.CoreEntry_X86_64, x86.UserX86RegsMode_NATIVE, 288, 288, ip),
		"stopped outside a call":   coreImage(t, core.CoreEntry_X86_64, x86.UserX86RegsMode_NATIVE, ^uint64(0), eintr, ip),
		"a compat task":            coreImage(t, core.CoreEntry_X86_64, x86.UserX86RegsMode_COMPAT, sysPoll, eintr, ip),
		"another architecture":     coreImage(t, core.CoreEntry_AARCH64, x86.UserX86RegsMode_NATIVE, sysPoll, eintr, ip),
		"ip below the instruction": coreImage(t, core.CoreEntry_X86_64, x86.UserX86RegsMode_NATIVE, sysPoll, eintr, 1),
	} {
		out, changed, err := RestartCore(img)
		if err != nil || changed || !bytes.Equal(out, img) {
			t.Errorf("%s: changed %v, %v", name, changed, err)
		}
	}
}

func TestRestartCoreRejects(t *testing.T) {
	good := coreImage(t, core.CoreEntry_X86_64, x86.UserX86RegsMode_NATIVE, sysPoll, eintr, 0x1000)
	wrongMagic := bytes.Clone(good)
	wrongMagic[4]++
	for name, b := range map[string][]byte{
		"empty":        nil,
		"short":        good[:10],
		"wrong magic":  wrongMagic,
		"truncated":    good[:len(good)-3],
		"trailing":     append(bytes.Clone(good), 0),
		"garbage body": append(bytes.Clone(good[:8]), 4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff),
	} {
		if _, _, err := RestartCore(b); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestRestartSyscalls(t *testing.T) {
	dir := t.TempDir()
	interrupted := coreImage(t, core.CoreEntry_X86_64, x86.UserX86RegsMode_NATIVE, sysPoll, eintr, 0x1000)
	running := coreImage(t, core.CoreEntry_X86_64, x86.UserX86RegsMode_NATIVE, 288, 288, 0x2000)
	for name, b := range map[string][]byte{"core-7.img": interrupted, "core-8.img": running, "pages-1.img": {1, 2, 3}} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n, err := RestartSyscalls(dir)
	if err != nil || n != 1 {
		t.Fatalf("rewrote %d, %v; want 1", n, err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "core-7.img"))
	if g := regs(t, b); g.GetAx() != sysPoll || g.GetIp() != 0x1000-2 {
		t.Errorf("core-7: ax %d ip %#x", g.GetAx(), g.GetIp())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "core-8.img")); !bytes.Equal(b, running) {
		t.Error("core-8 rewritten though it needed no change")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.restart")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if err := os.WriteFile(filepath.Join(dir, "core-9.img"), []byte("not an image"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := RestartSyscalls(dir); err != nil || n != 0 {
		t.Errorf("a corrupt core image: rewrote %d, %v; want it left for CRIU", n, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "core-9.img")); string(b) != "not an image" {
		t.Errorf("the corrupt core image was changed: %q", b)
	}
}

// FuzzRestartCore: a core image from a peer never panics the rewrite, and
// a rewritten image decodes to the same call issued again.
func FuzzRestartCore(f *testing.F) {
	f.Add(coreImage(f, core.CoreEntry_X86_64, x86.UserX86RegsMode_NATIVE, sysPoll, eintr, 0x1000))
	f.Add(coreImage(f, core.CoreEntry_X86_64, x86.UserX86RegsMode_NATIVE, 288, 288, 0x1000))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		out, changed, err := RestartCore(b)
		if err != nil || !changed {
			return
		}
		g := regs(t, out)
		if g.GetAx() != g.GetOrigAx() {
			t.Fatalf("rewritten to ax %d, orig_ax %d", g.GetAx(), g.GetOrigAx())
		}
	})
}
