package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/edgehop/edgehop/internal/probe"
	"github.com/edgehop/edgehop/internal/testutil"
)

// buildProbeBinary compiles cmd/probe statically, as the Makefile does.
func buildProbeBinary(t *testing.T) string {
	t.Helper()
	testutil.RequireTool(t, "go")
	out := filepath.Join(t.TempDir(), "probe")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "github.com/edgehop/edgehop/cmd/probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v\n%s", err, b)
	}
	return out
}

// The probe image end to end: build, cache, unpack, and the unpacked
// /probe really serves the protocol.
func TestProbeImageBuildUnpackRun(t *testing.T) {
	bin := buildProbeBinary(t)
	root := t.TempDir()
	ctx := context.Background()
	opts := BuildOptions{Root: root, ProbeBinary: bin}

	first, err := Build(ctx, Probe, opts)
	if err != nil {
		t.Fatal(err)
	}
	if first.Cached || first.Size <= 0 || !strings.HasPrefix(first.Digest, "sha256:") {
		t.Fatalf("first build: %+v", first)
	}
	second, err := Build(ctx, Probe, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !second.Cached || second.Digest != first.Digest {
		t.Fatalf("second build not a cached no-op: %+v vs %+v", second, first)
	}
	opts.Force = true
	forced, err := Build(ctx, Probe, opts)
	if err != nil {
		t.Fatal(err)
	}
	if forced.Cached || forced.Digest != first.Digest {
		t.Fatalf("forced rebuild: %+v; want a fresh write with the same (deterministic) digest %s", forced, first.Digest)
	}
	if left, _ := filepath.Glob(filepath.Join(root, ".tmp+*")); len(left) > 0 {
		t.Fatalf("temporary build directories left: %v", left)
	}

	img, err := Resolve(root, Probe)
	if err != nil {
		t.Fatal(err)
	}
	cfg := img.Config()
	if got := strings.Join(cfg.Args(), " "); got != "/probe 7000" {
		t.Fatalf("default args %q, want \"/probe 7000\"", got)
	}
	if len(cfg.Env) == 0 || !strings.HasPrefix(cfg.Env[0], "PATH=") || img.Platform() != "linux/amd64" && img.Platform() != "linux/arm64" {
		t.Fatalf("config %+v platform %s", cfg, img.Platform())
	}

	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := img.Unpack(ctx, rootfs); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(rootfs, "probe"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o755 {
		t.Fatalf("/probe mode %v, want 0755", fi.Mode())
	}

	// Port 0: the kernel picks one and the startup line says which.
	cmd := exec.Command(filepath.Join(rootfs, "probe"), "0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("startup line: %v", err)
	}
	i := strings.LastIndexByte(strings.TrimSpace(line), ':')
	if !strings.HasPrefix(line, "probe listening on ") || i < 0 {
		t.Fatalf("startup line %q", line)
	}
	port := strings.TrimSpace(line)[i+1:]
	rep, err := probe.RunClient(ctx, probe.ClientConfig{Addr: "127.0.0.1:" + port, Period: 2 * time.Millisecond,
		LineSize: 64, Conns: 3, Duration: 200 * time.Millisecond, Drain: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if p := rep.Problem(); p != "" || rep.Replies < 30 {
		t.Fatalf("unpacked probe: %d replies, problem %q", rep.Replies, p)
	}
}

func TestBuildRejects(t *testing.T) {
	root := t.TempDir()
	tests := []struct {
		name, image, bin, want string
	}{
		{"dynamic probe binary", Probe, "/bin/ls", "dynamically linked"},
		{"missing probe binary", Probe, filepath.Join(root, "nope"), "no such file"},
		{"unknown image", "nginx", "", "no built-in image"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Build(context.Background(), tt.image, BuildOptions{Root: root, ProbeBinary: tt.bin})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.want)
			}
		})
	}
	if _, err := Resolve(root, Probe); !errors.Is(err, ErrNotFound) {
		t.Fatalf("failed builds left an image: %v", err)
	}
}

// tarEntry is one entry of a hand-made layer.
type tarEntry struct {
	hdr  tar.Header
	body string
}

func layerOf(t *testing.T, entries ...tarEntry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		h.Size = int64(len(e.body))
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func imageOf(t *testing.T, layers ...v1.Layer) *Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Entrypoint: []string{"/bin/app"}, Env: []string{"A=b"}, WorkingDir: "/srv"})
	if err != nil {
		t.Fatal(err)
	}
	im, err := newImage("test", "", img)
	if err != nil {
		t.Fatal(err)
	}
	return im
}

func dir(name string, mode int64, uid int) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: uid}}
}
func file(name string, mode int64, uid int, body string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Uid: uid, Gid: uid}, body: body}
}
func symlink(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}
func hardlink(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}

// Every file type, mode and owner comes out as the layers say, with upper
// layers and whiteouts applied.
func TestUnpackFileTypes(t *testing.T) {
	lower := layerOf(t,
		dir("etc/", 0o755, 0),
		file("etc/old", 0o644, 0, "removed by the upper layer"),
		file("etc/motd", 0o644, 0, "lower"),
		dir("srv/", 0o750, 1000),
		tarEntry{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3}},
		tarEntry{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "srv/fifo", Mode: 0o600}},
	)
	upper := layerOf(t,
		file("etc/.wh.old", 0o644, 0, ""),
		file("etc/motd", 0o600, 0, "upper"),
		file("bin/app", 0o4755, 0, "#!/bin/sh\necho hi\n"),
		file("srv/data", 0o640, 1000, "data"),
		hardlink("srv/data.link", "srv/data"),
		symlink("srv/rel", "data"),
		symlink("srv/abs", "/etc/motd"),
		file("./deep/nested/file", 0o644, 0, "parents made on demand"),
	)
	img := imageOf(t, lower, upper)
	if c := img.Config(); c.WorkingDir != "/srv" || strings.Join(c.Args(), " ") != "/bin/app" || c.Env[0] != "A=b" {
		t.Fatalf("config %+v", c)
	}
	rootfs := t.TempDir()
	if err := img.Unpack(context.Background(), rootfs); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(rootfs, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	mode := func(p string) fs.FileMode {
		fi, err := os.Lstat(filepath.Join(rootfs, p))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode()
	}
	if got := read("etc/motd"); got != "upper" {
		t.Errorf("etc/motd = %q, want the upper layer's", got)
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "etc/old")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("whited-out etc/old exists: %v", err)
	}
	if m := mode("bin/app"); m.Perm() != 0o755 || m&fs.ModeSetuid == 0 {
		t.Errorf("bin/app mode %v, want setuid 0755", m)
	}
	if m := mode("etc/motd"); m.Perm() != 0o600 {
		t.Errorf("etc/motd mode %v", m)
	}
	if m := mode("srv"); !m.IsDir() || m.Perm() != 0o750 {
		t.Errorf("srv mode %v, want dir 0750", m)
	}
	if got := read("srv/rel"); got != "data" {
		t.Errorf("relative symlink reads %q", got)
	}
	if l, err := os.Readlink(filepath.Join(rootfs, "srv/abs")); err != nil || l != "/etc/motd" {
		t.Errorf("absolute symlink = %q, %v; want it kept as /etc/motd", l, err)
	}
	a, _ := os.Stat(filepath.Join(rootfs, "srv/data"))
	b, _ := os.Stat(filepath.Join(rootfs, "srv/data.link"))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Errorf("srv/data.link is not a hardlink of srv/data")
	}
	if got := read("deep/nested/file"); got != "parents made on demand" {
		t.Errorf("deep/nested/file = %q", got)
	}
	for _, p := range []string{"dev/null", "srv/fifo"} {
		if _, err := os.Lstat(filepath.Join(rootfs, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s should be skipped: %v", p, err)
		}
	}
	if fi, _ := os.Stat(filepath.Join(rootfs, "bin/app")); fi == nil || !fi.ModTime().Equal(time.Unix(1700000000, 0)) {
		t.Errorf("bin/app mtime not kept")
	}
	if os.Geteuid() == 0 {
		fi, _ := os.Stat(filepath.Join(rootfs, "srv/data"))
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("srv/data owner %d:%d, want 1000:1000", st.Uid, st.Gid)
		}
	} else {
		t.Log("owners not checked: not root")
	}
}

// No entry can write outside the rootfs, however the image is built.
func TestUnpackRefusesEscapes(t *testing.T) {
	tests := []struct {
		name    string
		entries []tarEntry
		wantErr bool // the unpack must fail, not merely stay inside
	}{
		// mutate.Extract already drops entries below a non-directory
		// entry; these guard that nothing changes that.
		{"file through an absolute symlink", []tarEntry{symlink("evil", "OUTSIDE"), file("evil/pwned", 0o644, 0, "x")}, false},
		{"dir through an absolute symlink", []tarEntry{symlink("evil", "OUTSIDE"), dir("evil/sub/", 0o755, 0)}, false},
		{"symlink through an absolute symlink", []tarEntry{symlink("evil", "OUTSIDE"), symlink("evil/pwned", "/etc/passwd")}, false},
		{"relative symlink out, then through it", []tarEntry{symlink("up", "../../../../../../../../.."), file("up/pwned", 0o644, 0, "x")}, false},
		// Here the os.Root is the defence: hardlinks are made last, when
		// the symlink exists.
		{"hardlink through an absolute symlink", []tarEntry{symlink("evil", "OUTSIDE"), hardlink("stolen", "evil/victim")}, true},
		{"hardlink to a host path", []tarEntry{hardlink("passwd", "OUTSIDE/victim")}, true},
		{"dot-dot name", []tarEntry{file("../pwned", 0o644, 0, "x")}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outside := t.TempDir()
			victim := filepath.Join(outside, "victim")
			if err := os.WriteFile(victim, []byte("intact"), 0o644); err != nil {
				t.Fatal(err)
			}
			var entries []tarEntry
			for _, e := range tt.entries {
				e.hdr.Linkname = strings.ReplaceAll(e.hdr.Linkname, "OUTSIDE", outside)
				if e.hdr.Typeflag == tar.TypeLink {
					e.hdr.Linkname = strings.TrimPrefix(e.hdr.Linkname, "/")
				}
				entries = append(entries, e)
			}
			rootfs := filepath.Join(t.TempDir(), "rootfs")
			err := imageOf(t, layerOf(t, entries...)).Unpack(context.Background(), rootfs)
			if tt.wantErr && err == nil {
				t.Errorf("unpack succeeded; want a refusal")
			}
			if err != nil {
				t.Logf("refused: %v", err)
			}
			if !tt.wantErr && err != nil {
				t.Errorf("unpack: %v", err)
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Errorf("something was written outside the rootfs: %v", ents)
			}
			if b, _ := os.ReadFile(victim); string(b) != "intact" {
				t.Errorf("victim changed: %q", b)
			}
			if fi, err := os.Stat(victim); err != nil || fi.Sys().(*syscall.Stat_t).Nlink != 1 {
				t.Errorf("victim got a hardlink into the rootfs")
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(rootfs), "pwned")); err == nil {
				t.Errorf("pwned written next to the rootfs")
			}
		})
	}
}

func TestUnpackStopsOnCancel(t *testing.T) {
	img := imageOf(t, layerOf(t, file("a", 0o644, 0, "x")))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := img.Unpack(ctx, t.TempDir()); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// writeLayout writes img as an OCI layout directory.
func writeLayout(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
}

// tarDir packs dir (plain files and directories) into a tar file.
func tarDir(t *testing.T, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, _ := d.Info()
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestImport(t *testing.T) {
	src := imageOf(t, layerOf(t, dir("app/", 0o755, 0), file("app/hello", 0o755, 0, "hello from an import")))
	work := t.TempDir()
	layoutDir := filepath.Join(work, "layout")
	writeLayout(t, src.img, layoutDir)
	ociTar := filepath.Join(work, "oci-archive.tar")
	tarDir(t, layoutDir, ociTar)
	dockerTar := filepath.Join(work, "docker-save.tar")
	tag, err := name.NewTag("example.test/app:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(dockerTar, tag, src.img); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(work, "junk.tar")
	if err := os.WriteFile(junk, []byte("not a tar at all"), 0o644); err != nil {
		t.Fatal(err)
	}

	root := t.TempDir()
	tests := []struct {
		name, src  string
		sameDigest bool // OCI sources keep the manifest; docker save is re-encoded
		wantErr    error
	}{
		{"oci layout dir", layoutDir, true, nil},
		{"oci archive tar", ociTar, true, nil},
		{"docker save tar", dockerTar, false, nil},
		{"not an image", junk, false, ErrUnknownFormat},
		{"empty dir", t.TempDir(), false, ErrUnknownFormat},
	}
	for k, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			imgName := "imp" + string(rune('a'+k))
			img, err := Import(context.Background(), root, imgName, tt.src, 0)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if _, err := Resolve(root, imgName); !errors.Is(err, ErrNotFound) {
					t.Fatalf("failed import left an image: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.sameDigest && img.Digest() != src.Digest() {
				t.Errorf("digest %s, want the source's %s", img.Digest(), src.Digest())
			}
			if c := img.Config(); c.WorkingDir != "/srv" || c.Entrypoint[0] != "/bin/app" {
				t.Errorf("config not carried over: %+v", c)
			}
			rootfs := t.TempDir()
			if err := img.Unpack(context.Background(), rootfs); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(rootfs, "app/hello")); err != nil || string(b) != "hello from an import" {
				t.Fatalf("app/hello = %q, %v", b, err)
			}
		})
	}

	// Re-importing under an existing name replaces it.
	if _, err := Import(context.Background(), root, "impa", dockerTar, 0); err != nil {
		t.Fatal(err)
	}
	infos, err := List(root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range infos {
		names = append(names, i.Name)
		if i.Size <= 0 || i.Layers != 1 {
			t.Errorf("listing %+v", i)
		}
	}
	if got := strings.Join(names, ","); got != "impa,impb,impc" {
		t.Fatalf("List names %q, want impa,impb,impc", got)
	}
	if left, _ := filepath.Glob(filepath.Join(root, ".tmp+*")); len(left) > 0 {
		t.Fatalf("temporary directories left: %v", left)
	}
}

func TestNames(t *testing.T) {
	root := t.TempDir()
	for _, bad := range []string{"", "..", "a/b", "Upper", ".hidden", strings.Repeat("x", 65)} {
		if _, err := Resolve(root, bad); !errors.Is(err, ErrBadName) {
			t.Errorf("Resolve(%q) = %v, want ErrBadName", bad, err)
		}
	}
	if _, err := Resolve(root, "absent"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Resolve(absent) = %v, want ErrNotFound", err)
	}
	if infos, err := List(filepath.Join(root, "missing")); err != nil || len(infos) != 0 {
		t.Errorf("List of a missing root = %v, %v", infos, err)
	}
}

// Builds of one name serialise on the lock; a work directory left by a
// dead build is removed by the next one.
func TestBuildConcurrentAndStale(t *testing.T) {
	bin := buildProbeBinary(t)
	root := t.TempDir()
	stale := filepath.Join(root, ".tmp+probe+12345")
	if err := os.MkdirAll(filepath.Join(stale, "layout/blobs"), 0o755); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(root, ".tmp+probe-x+1") // another name's work: not ours to remove
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 3
	results := make(chan Result, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			res, err := Build(context.Background(), Probe, BuildOptions{Root: root, ProbeBinary: bin})
			results <- res
			errs <- err
		}()
	}
	var built, cached int
	var digests []string
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		res := <-results
		if res.Cached {
			cached++
		} else {
			built++
		}
		digests = append(digests, res.Digest)
	}
	if built != 1 || cached != n-1 {
		t.Fatalf("%d built, %d cached; want exactly one build", built, cached)
	}
	for _, d := range digests[1:] {
		if d != digests[0] {
			t.Fatalf("digests differ: %v", digests)
		}
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stale work directory not removed: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("another name's work directory was removed: %v", err)
	}
}

// TestImportBound: a source past Import's bound is refused, as a file
// and once decompressed (a gzip bomb), naming the bound.
func TestImportBound(t *testing.T) {
	dir := t.TempDir()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(make([]byte, 4<<20)); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	bomb := filepath.Join(dir, "bomb.tar.gz")
	if err := os.WriteFile(bomb, gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, max := range []int64{1 << 20, int64(gz.Len()) - 1} {
		_, err := Import(context.Background(), filepath.Join(dir, "root"), "bomb", bomb, max)
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), strconv.FormatInt(max, 10)) {
			t.Errorf("bound %d: %v, want ErrTooLarge naming it", max, err)
		}
	}
}
