package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/edgehop/edgehop/internal/linux"
)

// ErrToolMissing is returned when a program the build needs is not installed.
var ErrToolMissing = errors.New("required tool not installed")

// chrootEnv is the environment of commands run inside the rootfs being built.
var chrootEnv = []string{DefaultPath, "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C", "HOME=/root"}

// debianImage is the recipe of an image built from Debian packages.
type debianImage struct {
	name string
	// version is bumped when the build steps change in a way the other
	// fields do not show.
	version  string
	packages []string
	// files are written into the rootfs after the packages are
	// installed, in path order (paths relative to the rootfs).
	files map[string]debianFile
	// commands run in the chroot after the files are written.
	commands [][]string
	config   v1.Config // Env gets DefaultPath first; Labels gets the recipe
}

// debianFile is one file a debianImage adds.
type debianFile struct {
	mode os.FileMode
	data string
}

// ServicePackages are installed into the services image.
var ServicePackages = []string{"redis-server", "memcached", "mosquitto"}

// mosquittoConf is added to Debian's unmodified mosquitto configuration
// as /etc/mosquitto/conf.d/edgehop.conf: the broker listens on every
// address without credentials, as the migration scenarios need. Debian's
// own file stays as packaged: a pid file in /run/mosquitto, persistence
// in /var/lib/mosquitto, a log file, and the broker dropping to user
// mosquitto.
const mosquittoConf = `# edgehop services image: reachable from other hosts, no authentication.
listener 1883 0.0.0.0
allow_anonymous true
`

// debianImages are the built-in images Build makes with buildDebian.
var debianImages = map[string]debianImage{
	Services: {name: Services, version: "services v3", packages: ServicePackages,
		files: map[string]debianFile{"etc/mosquitto/conf.d/edgehop.conf": {0o644, mosquittoConf}},
		// What Debian's unit does before starting the broker (no init
		// runs in a container).
		commands: [][]string{{"install", "-d", "-o", "mosquitto", "-g", "mosquitto", "/run/mosquitto"}}},
	WordPress: wordpressImage,
}

// buildDebian makes a Debian minbase rootfs with debootstrap, installs
// the recipe's packages into it with apt inside a chroot, strips caches
// and documentation, adds the recipe's files, runs its commands, and
// packs it as one layer. It needs root and network access to the mirror.
func buildDebian(ctx context.Context, d debianImage, opts BuildOptions) (res Result, err error) {
	recipe := d.recipe(opts.Suite)
	if cached, ok := cachedResult(opts.Root, d.name); ok && !opts.Force {
		if img, err := Resolve(opts.Root, d.name); err == nil && img.file.Config.Labels[RecipeLabel] == recipe {
			return cached, nil
		}
		opts.Logger.Info("cached image was built by another recipe; rebuilding", "image", d.name)
	}
	for _, tool := range []string{"debootstrap", "chroot"} {
		if _, err := exec.LookPath(tool); err != nil {
			return Result{}, fmt.Errorf("%w: %s", ErrToolMissing, tool)
		}
	}
	work, err := workDir(opts.Root, d.name)
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, removeWorkDir(work)) }()
	rootfs := filepath.Join(work, "rootfs")
	log := opts.Logger.With("image", d.name)

	step := func(what string, name string, args ...string) error {
		t := time.Now()
		cmd := linux.GroupCommand(ctx, name, args...)
		cmd.Env = chrootEnv
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("%s: %w", what, ctx.Err())
			}
			return fmt.Errorf("%s: %w: %s", what, err, tail(out.String(), 800))
		}
		log.Info("build step done", "step", what, "took", time.Since(t).Round(time.Millisecond))
		return nil
	}
	chroot := func(what string, args ...string) error {
		return step(what, "chroot", append([]string{rootfs}, args...)...)
	}

	if err := step("debootstrap", "debootstrap", "--variant=minbase", opts.Suite, rootfs, opts.Mirror); err != nil {
		return Result{}, err
	}
	// Package scripts must not start services in the build chroot.
	policy := filepath.Join(rootfs, "usr/sbin/policy-rc.d")
	if err := os.WriteFile(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return Result{}, err
	}
	if err := chroot("apt-get update", "apt-get", "-q", "update"); err != nil {
		return Result{}, err
	}
	pkgs := append([]string{"apt-get", "-q", "-y", "--no-install-recommends", "install"}, d.packages...)
	if err := chroot("apt-get install", pkgs...); err != nil {
		return Result{}, err
	}
	if err := chroot("apt-get clean", "apt-get", "clean"); err != nil {
		return Result{}, err
	}
	if err := os.Remove(policy); err != nil {
		return Result{}, err
	}
	for _, glob := range []string{
		"var/lib/apt/lists/*", "var/cache/apt/*", "var/cache/debconf/*-old", "var/log/apt/*",
		"usr/share/doc/*", "usr/share/man/*", "usr/share/info/*", "usr/share/lintian/*",
	} {
		matches, err := filepath.Glob(filepath.Join(rootfs, glob))
		if err != nil {
			return Result{}, err
		}
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return Result{}, err
			}
		}
	}
	for _, p := range slices.Sorted(maps.Keys(d.files)) {
		f := d.files[p]
		dst := filepath.Join(rootfs, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return Result{}, err
		}
		if err := os.WriteFile(dst, []byte(f.data), f.mode); err != nil {
			return Result{}, fmt.Errorf("write %s: %w", p, err)
		}
		if err := os.Chmod(dst, f.mode); err != nil { // WriteFile's mode is masked by umask
			return Result{}, err
		}
	}
	for _, c := range d.commands {
		if err := chroot(strings.Join(c, " "), c...); err != nil {
			return Result{}, err
		}
	}

	// debootstrap unmounts what it mounted; make sure before packing.
	if err := linux.UnmountUnder(rootfs); err != nil {
		return Result{}, err
	}
	t := time.Now()
	layerPath := filepath.Join(work, "layer.tar.gz")
	f, err := os.Create(layerPath)
	if err != nil {
		return Result{}, err
	}
	err = packDir(ctx, rootfs, f, "dev", "proc", "sys")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Result{}, err
	}
	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return Result{}, fmt.Errorf("%s layer: %w", d.name, err)
	}
	log.Info("build step done", "step", "pack", "took", time.Since(t).Round(time.Millisecond))
	cfg := d.config
	cfg.Env = append([]string{DefaultPath}, cfg.Env...)
	cfg.Labels = map[string]string{RecipeLabel: recipe}
	img, err := assemble(layer, runtime.GOARCH, time.Now(), cfg)
	if err != nil {
		return Result{}, err
	}
	return install(ctx, opts.Root, d.name, img)
}

// RecipeLabel is the config label holding the hash of the recipe an image
// was built by; a cached image built by another recipe (older packages
// list or configuration) is rebuilt.
const RecipeLabel = "org.edgehop.recipe"

// recipe identifies everything buildDebian puts into the image apart
// from the package versions the mirror serves.
func (d debianImage) recipe(suite string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\nsuite %s\npackages %s\n", d.version, suite, strings.Join(d.packages, " "))
	for _, p := range slices.Sorted(maps.Keys(d.files)) {
		fmt.Fprintf(h, "file %s %o %q\n", p, d.files[p].mode, d.files[p].data)
	}
	for _, c := range d.commands {
		fmt.Fprintf(h, "run %q\n", c)
	}
	fmt.Fprintf(h, "config %q %q %q %q\n", d.config.Env, d.config.Cmd, d.config.User, d.config.ExposedPorts)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return strings.ReplaceAll(s, "\n", " | ")
}
