package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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

// buildServices makes a Debian minbase rootfs with debootstrap, installs
// ServicePackages into it with apt inside a chroot, strips caches and
// documentation, and packs it as one layer. It needs root and network
// access to the mirror.
func buildServices(ctx context.Context, opts BuildOptions) (res Result, err error) {
	recipe := servicesRecipe(opts.Suite)
	if cached, ok := cachedResult(opts.Root, Services); ok && !opts.Force {
		if img, err := Resolve(opts.Root, Services); err == nil && img.file.Config.Labels[RecipeLabel] == recipe {
			return cached, nil
		}
		opts.Logger.Info("cached image was built by another recipe; rebuilding", "image", Services)
	}
	for _, tool := range []string{"debootstrap", "chroot"} {
		if _, err := exec.LookPath(tool); err != nil {
			return Result{}, fmt.Errorf("%w: %s", ErrToolMissing, tool)
		}
	}
	work, err := workDir(opts.Root, Services)
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, removeWorkDir(work)) }()
	rootfs := filepath.Join(work, "rootfs")
	log := opts.Logger.With("image", Services)

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
	pkgs := append([]string{"apt-get", "-q", "-y", "--no-install-recommends", "install"}, ServicePackages...)
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
	conf := filepath.Join(rootfs, "etc/mosquitto/conf.d/edgehop.conf")
	if err := os.WriteFile(conf, []byte(mosquittoConf), 0o644); err != nil {
		return Result{}, fmt.Errorf("mosquitto config: %w", err)
	}
	// What Debian's unit does before starting the broker (no init runs
	// in a container).
	if err := chroot("mosquitto run directory", "install", "-d", "-o", "mosquitto", "-g", "mosquitto", "/run/mosquitto"); err != nil {
		return Result{}, err
	}

	// debootstrap unmounts what it mounted; make sure before packing.
	if err := unmountUnder(rootfs); err != nil {
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
		return Result{}, fmt.Errorf("services layer: %w", err)
	}
	log.Info("build step done", "step", "pack", "took", time.Since(t).Round(time.Millisecond))
	img, err := assemble(layer, runtime.GOARCH, time.Now(), v1.Config{
		Env:    []string{DefaultPath},
		Labels: map[string]string{RecipeLabel: recipe},
	})
	if err != nil {
		return Result{}, err
	}
	return install(ctx, opts.Root, Services, img)
}

// RecipeLabel is the config label holding the hash of the recipe an image
// was built by; a cached services image built by another recipe (older
// packages list or configuration) is rebuilt.
const RecipeLabel = "org.edgehop.recipe"

// servicesRecipe identifies everything buildServices puts into the image
// apart from the package versions the mirror serves. Bump the version
// string when the build steps change.
func servicesRecipe(suite string) string {
	h := sha256.New()
	fmt.Fprintf(h, "services v2\nsuite %s\npackages %s\nconf.d/edgehop.conf %s\n", suite, strings.Join(ServicePackages, " "), mosquittoConf)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return strings.ReplaceAll(s, "\n", " | ")
}
