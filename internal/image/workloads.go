package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// DPRGen names the workload image holding the dirty page rate generator
// (cmd/dprgen) at /dprgen, its entrypoint.
const DPRGen = "dprgen"

// DPRGenPort is the TCP port the dprgen image exposes (its check
// protocol, internal/workload).
const DPRGenPort = 7001

// Workloads lists the workload images BuildWorkload makes.
func Workloads() []string { return []string{DPRGen} }

// WorkloadOptions configures BuildWorkload. The zero value builds into
// DefaultRoot from the binary of that name next to the running executable.
type WorkloadOptions struct {
	Root   string       // image cache; "" means DefaultRoot
	Binary string       // static binary of the workload; "" means WorkloadBinaryPath(name)
	Force  bool         // rebuild even when the cache holds an identical image
	Logger *slog.Logger // progress; nil discards
}

// WorkloadBinaryPath returns where the binary of workload name is looked
// for by default: next to the running executable (the Makefile builds
// bin/dprgen beside bin/edgehop).
func WorkloadBinaryPath(name string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find executable: %w", err)
	}
	return filepath.Join(filepath.Dir(exe), name), nil
}

// BuildWorkload makes the workload image name in the cache: one layer
// with the static binary at /name, which is the entrypoint. The build is
// deterministic, so a cached image counts only if it has the digest the
// current binary gives (unless opts.Force). Builds of one name are
// serialised across processes; the image appears atomically.
func BuildWorkload(ctx context.Context, name string, opts WorkloadOptions) (Result, error) {
	start := time.Now()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Root = rootOrDefault(opts.Root)
	var cfg v1.Config
	switch name {
	case DPRGen:
		cfg = v1.Config{
			Entrypoint:   []string{"/" + DPRGen},
			Cmd:          []string{"--state-mb", "10", "--rate", "max"},
			Env:          []string{DefaultPath},
			ExposedPorts: map[string]struct{}{fmt.Sprintf("%d/tcp", DPRGenPort): {}},
		}
	default:
		return Result{}, fmt.Errorf("build %q: %w (workloads: %s)", name, ErrUnknownImage, strings.Join(Workloads(), ", "))
	}
	bin := opts.Binary
	if bin == "" {
		var err error
		if bin, err = WorkloadBinaryPath(name); err != nil {
			return Result{}, fmt.Errorf("build %s: %w", name, err)
		}
	}
	arch, err := staticELF(bin)
	if err != nil {
		if opts.Binary == "" && errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w (build it with 'make build')", err)
		}
		return Result{}, fmt.Errorf("build %s: %w", name, err)
	}
	release, err := lockName(ctx, opts.Root, name)
	if err != nil {
		return Result{}, fmt.Errorf("build %s: %w", name, err)
	}
	defer release()

	var layerBuf bytes.Buffer
	if err := packFile(bin, name, 0o755, &layerBuf); err != nil {
		return Result{}, fmt.Errorf("build %s: pack %s: %w", name, bin, err)
	}
	layer, err := tarball.LayerFromOpener(bytesOpener(layerBuf.Bytes()), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return Result{}, fmt.Errorf("build %s: layer: %w", name, err)
	}
	img, err := assemble(layer, arch, time.Unix(0, 0), cfg)
	if err != nil {
		return Result{}, fmt.Errorf("build %s: %w", name, err)
	}
	want, err := img.Digest()
	if err != nil {
		return Result{}, fmt.Errorf("build %s: %w", name, err)
	}
	res, ok := cachedResult(opts.Root, name)
	if !ok || opts.Force || res.Digest != want.String() {
		if res, err = install(ctx, opts.Root, name, img); err != nil {
			return Result{}, fmt.Errorf("build %s: %w", name, err)
		}
	}
	res.Duration = time.Since(start)
	opts.Logger.Info("image ready", "image", name, "digest", res.Digest, "size", res.Size, "cached", res.Cached, "took", res.Duration)
	return res, nil
}
