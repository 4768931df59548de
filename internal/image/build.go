package image

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// DefaultMirror is the Debian mirror the services image is built from.
const DefaultMirror = "http://deb.debian.org/debian"

// DefaultPath is the PATH of the built-in images.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ErrUnknownImage is returned by Build for a name it has no recipe for.
var ErrUnknownImage = errors.New("no built-in image of that name")

// BuildOptions configures Build. The zero value builds into DefaultRoot
// with the probe binary found next to the running executable.
type BuildOptions struct {
	Root        string       // image cache; "" means DefaultRoot
	ProbeBinary string       // static probe binary; "" means "probe" next to os.Executable()
	Force       bool         // rebuild even when the cache holds the image
	Mirror      string       // Debian mirror; "" means DefaultMirror
	Suite       string       // Debian suite; "" means "bookworm"
	Logger      *slog.Logger // progress; nil discards
}

func (o BuildOptions) withDefaults() BuildOptions {
	o.Root = rootOrDefault(o.Root)
	if o.Mirror == "" {
		o.Mirror = DefaultMirror
	}
	if o.Suite == "" {
		o.Suite = "bookworm"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Result reports one Build.
type Result struct {
	Name     string        `json:"name"`
	Dir      string        `json:"dir"`
	Digest   string        `json:"digest"`
	Size     int64         `json:"size"`
	Cached   bool          `json:"cached"` // the cache already held this image; nothing was written
	Duration time.Duration `json:"duration_ns"`
}

// Build makes the built-in image name (Probe, or one of the Debian images:
// Services, WordPress) in the cache.
// When the cache already has it, Build does nothing unless opts.Force is
// set; for Probe, whose build is deterministic, a cached image counts only
// if it has the digest the current probe binary gives. Concurrent builds of
// one name, in any process, are serialised; the image appears atomically.
func Build(ctx context.Context, name string, opts BuildOptions) (Result, error) {
	opts = opts.withDefaults()
	start := time.Now()
	deb, isDebian := debianImages[name]
	if name != Probe && !isDebian {
		return Result{}, fmt.Errorf("build %q: %w (have %s)", name, ErrUnknownImage, strings.Join(Builtins(), ", "))
	}
	release, err := lockName(ctx, opts.Root, name)
	if err != nil {
		return Result{}, fmt.Errorf("build %s: %w", name, err)
	}
	defer release()

	var res Result
	if name == Probe {
		res, err = buildProbe(ctx, opts)
	} else {
		res, err = buildDebian(ctx, deb, opts)
	}
	if err != nil {
		return Result{}, fmt.Errorf("build %s: %w", name, err)
	}
	res.Duration = time.Since(start)
	opts.Logger.Info("image ready", "image", name, "digest", res.Digest, "size", res.Size, "cached", res.Cached, "took", res.Duration)
	return res, nil
}

func cachedResult(root, name string) (Result, bool) {
	img, err := Resolve(root, name)
	if err != nil {
		return Result{}, false
	}
	size, err := blobBytes(img.Dir())
	if err != nil {
		return Result{}, false
	}
	return Result{Name: name, Dir: img.Dir(), Digest: img.Digest(), Size: size, Cached: true}, true
}

// ProbeBinaryPath returns where the probe binary is looked for by default:
// "probe" in the directory of the running executable (the Makefile builds
// bin/probe next to bin/edgehop).
func ProbeBinaryPath() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find executable: %w", err)
	}
	return filepath.Join(filepath.Dir(exe), "probe"), nil
}

func buildProbe(ctx context.Context, opts BuildOptions) (Result, error) {
	bin := opts.ProbeBinary
	if bin == "" {
		var err error
		if bin, err = ProbeBinaryPath(); err != nil {
			return Result{}, err
		}
	}
	arch, err := staticELF(bin)
	if err != nil {
		if opts.ProbeBinary == "" && errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w (build it with 'make build', or name it with --probe)", err)
		}
		return Result{}, err
	}
	var layerBuf bytes.Buffer
	if err := packFile(bin, "probe", 0o755, &layerBuf); err != nil {
		return Result{}, fmt.Errorf("pack %s: %w", bin, err)
	}
	layerBytes := layerBuf.Bytes()
	layer, err := tarball.LayerFromOpener(bytesOpener(layerBytes), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return Result{}, fmt.Errorf("probe layer: %w", err)
	}
	img, err := assemble(layer, arch, time.Unix(0, 0), v1.Config{
		Entrypoint:   []string{"/probe"},
		Cmd:          []string{"7000"},
		Env:          []string{DefaultPath},
		ExposedPorts: map[string]struct{}{"7000/tcp": {}},
	})
	if err != nil {
		return Result{}, err
	}
	want, err := img.Digest()
	if err != nil {
		return Result{}, err
	}
	if cached, ok := cachedResult(opts.Root, Probe); ok && !opts.Force && cached.Digest == want.String() {
		return cached, nil
	}
	return install(ctx, opts.Root, Probe, img)
}

// staticELF checks that bin is a statically linked ELF executable (no
// interpreter) and returns its GOARCH-style architecture.
func staticELF(bin string) (string, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return "", fmt.Errorf("probe binary %s: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("probe binary %s is dynamically linked; build it with CGO_ENABLED=0", bin)
		}
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	case elf.EM_386:
		return "386", nil
	case elf.EM_ARM:
		return "arm", nil
	case elf.EM_RISCV:
		return "riscv64", nil
	}
	return "", fmt.Errorf("probe binary %s: unsupported machine %v", bin, f.Machine)
}

func bytesOpener(b []byte) tarball.Opener {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

// assemble makes a one-layer OCI image with the given config.
func assemble(layer v1.Layer, arch string, created time.Time, cfg v1.Config) (v1.Image, error) {
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: created.UTC()}
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}

// install writes img as the layout root/name: into a temporary directory
// first, then renamed into place (replacing an older image of that name).
// The caller holds the name's lock.
func install(ctx context.Context, root, name string, img v1.Image) (Result, error) {
	tmp, err := workDir(root, name)
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return Result{}, fmt.Errorf("write layout: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": name,
	})); err != nil {
		return Result{}, fmt.Errorf("write image: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	final := filepath.Join(root, name)
	old := filepath.Join(tmp, "old")
	hadOld := true
	if err := os.Rename(final, old); errors.Is(err, fs.ErrNotExist) {
		hadOld = false
	} else if err != nil {
		return Result{}, fmt.Errorf("move old image aside: %w", err)
	}
	if err := os.Rename(dir, final); err != nil {
		if hadOld {
			err = errors.Join(err, os.Rename(old, final))
		}
		return Result{}, fmt.Errorf("install image: %w", err)
	}
	res, ok := cachedResult(root, name)
	if !ok {
		return Result{}, fmt.Errorf("installed image %s does not open", final)
	}
	res.Cached = false
	return res, nil
}
