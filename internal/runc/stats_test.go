package runc_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/stats"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/edgehop/edgehop/internal/runc"
)

// statsImage builds a CRIU stats image around e.
func statsImage(t *testing.T, e *stats.StatsEntry) []byte {
	t.Helper()
	payload, err := proto.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	buf := binary.LittleEndian.AppendUint32(nil, stats.ImgServiceMagic)
	buf = binary.LittleEndian.AppendUint32(buf, stats.StatsMagic)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(payload)))
	return append(buf, payload...)
}

func TestReadStats(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, stats.StatsDump), statsImage(t, &stats.StatsEntry{Dump: &stats.DumpStatsEntry{
		FreezingTime: proto.Uint32(1500), FrozenTime: proto.Uint32(120000),
		MemdumpTime: proto.Uint32(3000), MemwriteTime: proto.Uint32(200),
		PagesScanned: proto.Uint64(48), PagesSkippedParent: proto.Uint64(0),
		PagesWritten: proto.Uint64(34), PagesLazy: proto.Uint64(0),
	}}))
	write(t, filepath.Join(dir, stats.StatsRestore), statsImage(t, &stats.StatsEntry{Restore: &stats.RestoreStatsEntry{
		PagesCompared: proto.Uint64(9), PagesSkippedCow: proto.Uint64(0),
		ForkingTime: proto.Uint32(400), RestoreTime: proto.Uint32(130000), PagesRestored: proto.Uint64(32),
	}}))
	ds, err := runc.ReadDumpStats(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := runc.DumpStats{FreezingTime: 1500 * time.Microsecond, FrozenTime: 120 * time.Millisecond,
		MemdumpTime: 3 * time.Millisecond, MemwriteTime: 200 * time.Microsecond, PagesScanned: 48, PagesWritten: 34}
	if ds != want {
		t.Errorf("dump stats %+v, want %+v", ds, want)
	}
	rs, err := runc.ReadRestoreStats(dir)
	if err != nil {
		t.Fatal(err)
	}
	wantR := runc.RestoreStats{ForkingTime: 400 * time.Microsecond, RestoreTime: 130 * time.Millisecond, PagesCompared: 9, PagesRestored: 32}
	if rs != wantR {
		t.Errorf("restore stats %+v, want %+v", rs, wantR)
	}
}

func TestReadStatsDamaged(t *testing.T) {
	good := statsImage(t, &stats.StatsEntry{Dump: &stats.DumpStatsEntry{
		FreezingTime: proto.Uint32(1), FrozenTime: proto.Uint32(2), MemdumpTime: proto.Uint32(3),
		MemwriteTime: proto.Uint32(4), PagesScanned: proto.Uint64(5), PagesSkippedParent: proto.Uint64(0),
		PagesWritten: proto.Uint64(5), PagesLazy: proto.Uint64(0),
	}})
	tests := []struct {
		name string
		data []byte // nil: no file
		want string
	}{
		{"missing", nil, "no such file"},
		{"empty", []byte{}, "too short"},
		{"short", good[:6], "too short"},
		{"wrong magic", append([]byte{1, 2, 3, 4}, good[4:]...), "primary magic"},
		{"wrong stats magic", append(append([]byte{}, good[:4]...), append([]byte{1, 2, 3, 4}, good[8:]...)...), "secondary magic"},
		{"payload overruns", good[:len(good)-3], "overruns"},
		{"restore entry only", statsImage(t, &stats.StatsEntry{Restore: &stats.RestoreStatsEntry{
			PagesCompared: proto.Uint64(1), PagesSkippedCow: proto.Uint64(0), ForkingTime: proto.Uint32(1), RestoreTime: proto.Uint32(1),
		}}), "no dump entry"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.data != nil {
				write(t, filepath.Join(dir, stats.StatsDump), tt.data)
			}
			_, err := runc.ReadDumpStats(dir)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// pagemapImage builds a CRIU pagemap image: common and pagemap magics, a
// head, then one entry per run. CRIU 4 writes the page count into field 5
// and zero into compat field 2; older images have only field 2.
func pagemapImage(runs ...[3]uint64) []byte {
	buf := binary.LittleEndian.AppendUint32(nil, 0x54564319)
	buf = binary.LittleEndian.AppendUint32(buf, 0x56084025)
	entry := func(b []byte) {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(b)))
		buf = append(buf, b...)
	}
	entry(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1)) // pages_id
	for i, r := range runs {
		pages, flags, criu4 := r[0], r[1], r[2] == 1
		var b []byte
		b = protowire.AppendVarint(protowire.AppendTag(b, 1, protowire.VarintType), uint64(0x400000+i*0x10000))
		if criu4 {
			b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.VarintType), 0)
		} else {
			b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.VarintType), pages)
		}
		b = protowire.AppendVarint(protowire.AppendTag(b, 4, protowire.VarintType), flags)
		if criu4 {
			b = protowire.AppendVarint(protowire.AppendTag(b, 5, protowire.VarintType), pages)
		}
		entry(b)
	}
	return buf
}

func TestReadMemoryStats(t *testing.T) {
	const (
		parent  = 1
		lazy    = 2
		present = 4
	)
	dir := t.TempDir()
	write(t, filepath.Join(dir, "pagemap-1.img"), pagemapImage(
		[3]uint64{4, present, 1}, [3]uint64{10, lazy | present, 1}, [3]uint64{7, lazy, 1}))
	write(t, filepath.Join(dir, "pagemap-2.img"), pagemapImage([3]uint64{3, present, 0}, [3]uint64{5, parent, 0}))
	write(t, filepath.Join(dir, "pages-1.img"), make([]byte, 17*4096))
	ms, err := runc.ReadMemoryStats(dir)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := os.ReadDir(dir)
	var size int64
	for _, f := range files {
		info, _ := f.Info()
		size += info.Size()
	}
	want := runc.MemoryStats{Processes: 2, Pages: 29, PresentPages: 17, LazyPages: 7, ParentPages: 5, ImageBytes: size}
	if ms != want {
		t.Errorf("memory stats %+v, want %+v", ms, want)
	}

	for name, data := range map[string][]byte{
		"not a pagemap": []byte("garbage!"),
		"truncated":     pagemapImage([3]uint64{4, present, 1})[:20],
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, "pagemap-1.img"), data)
			if _, err := runc.ReadMemoryStats(dir); err == nil {
				t.Fatal("damaged pagemap accepted")
			}
		})
	}
	if _, err := runc.ReadMemoryStats(t.TempDir()); err == nil {
		t.Error("directory without pagemaps accepted")
	}
}
