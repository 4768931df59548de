package image

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// DefaultRoot is where images live unless a caller says otherwise.
const DefaultRoot = "/var/lib/edgehop/images"

// Names of the built-in images.
const (
	Probe    = "probe"    // the static continuity probe at /probe
	Services = "services" // Debian bookworm with redis-server, memcached and mosquitto
	// WordPress is Debian bookworm with wordpress, apache2 (mod_php) and
	// mariadb-server: CloudHopper's web and database tiers, run as two
	// containers of one group (see wordpress.go).
	WordPress = "wordpress"
)

// Builtins lists the images Build knows how to make.
func Builtins() []string { return []string{Probe, Services, WordPress} }

var (
	// ErrNotFound is returned when no image of that name is in the cache.
	ErrNotFound = errors.New("image not found")
	// ErrBadName is returned for names that are not a single lowercase
	// path element.
	ErrBadName = errors.New("bad image name")
)

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// ValidName reports whether name can name an image in the cache.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w %q: want [a-z0-9][a-z0-9._-]*, at most 64 characters", ErrBadName, name)
	}
	return nil
}

// Config is the part of an image's OCI config a runtime needs.
type Config struct {
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	// StopSignal is the signal that asks the service to stop ("" : the
	// image declares none).
	StopSignal string `json:"stop_signal,omitempty"`
	// ExposedPorts are the ports the image declares ("6379/tcp"), sorted.
	ExposedPorts []string `json:"exposed_ports,omitempty"`
	// Volumes are the directories the image declares as volumes, sorted.
	Volumes []string `json:"volumes,omitempty"`
}

// Args returns the process arguments the image runs by default:
// Entrypoint followed by Cmd.
func (c Config) Args() []string {
	return append(append([]string{}, c.Entrypoint...), c.Cmd...)
}

// Image is one image of the cache, opened read-only. It is safe for
// concurrent use; the directory must not be replaced while it is in use.
type Image struct {
	name   string
	dir    string
	img    v1.Image
	digest v1.Hash
	cfg    Config
	file   *v1.ConfigFile
}

// Open opens the OCI image layout at dir. When the layout holds several
// images (a multi-platform index), the one for linux/GOARCH is used.
func Open(dir string) (*Image, error) {
	ii, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("open image %s: %w", dir, ErrNotFound)
		}
		return nil, fmt.Errorf("open image %s: %w", dir, err)
	}
	img, err := pickImage(ii)
	if err != nil {
		return nil, fmt.Errorf("open image %s: %w", dir, err)
	}
	return newImage(filepath.Base(dir), dir, img)
}

func newImage(name, dir string, img v1.Image) (*Image, error) {
	digest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("image %s digest: %w", name, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s config: %w", name, err)
	}
	c := cf.Config
	ports := make([]string, 0, len(c.ExposedPorts))
	for p := range c.ExposedPorts {
		ports = append(ports, p)
	}
	sort.Strings(ports)
	vols := make([]string, 0, len(c.Volumes))
	for v := range c.Volumes {
		vols = append(vols, v)
	}
	sort.Strings(vols)
	return &Image{name: name, dir: dir, img: img, digest: digest, file: cf, cfg: Config{
		Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, WorkingDir: c.WorkingDir, User: c.User,
		StopSignal: c.StopSignal, ExposedPorts: ports, Volumes: vols,
	}}, nil
}

// Resolve opens the image called name in the cache at root ("" means
// DefaultRoot); it returns ErrNotFound when there is none.
func Resolve(root, name string) (*Image, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	return Open(filepath.Join(rootOrDefault(root), name))
}

func rootOrDefault(root string) string {
	if root == "" {
		return DefaultRoot
	}
	return root
}

// Name returns the image's name (its directory's base name).
func (i *Image) Name() string { return i.name }

// Dir returns the image's layout directory.
func (i *Image) Dir() string { return i.dir }

// Digest returns the manifest digest, "sha256:…".
func (i *Image) Digest() string { return i.digest.String() }

// Config returns the entrypoint, cmd, env and working directory.
func (i *Image) Config() Config { return i.cfg }

// Platform returns "os/architecture" from the image config.
func (i *Image) Platform() string { return i.file.OS + "/" + i.file.Architecture }

// Created returns the image's creation time from its config.
func (i *Image) Created() time.Time { return i.file.Created.Time }

// Info describes one image of the cache for listings.
type Info struct {
	Name     string    `json:"name"`
	Digest   string    `json:"digest"`
	Platform string    `json:"platform"`
	Layers   int       `json:"layers"`
	Size     int64     `json:"size"` // bytes of the layout directory's blobs (compressed layers)
	Created  time.Time `json:"created"`
	Config   Config    `json:"config"`
	Dir      string    `json:"dir"`
}

// Info returns the listing entry of the image.
func (i *Image) Info() (Info, error) {
	layers, err := i.img.Layers()
	if err != nil {
		return Info{}, fmt.Errorf("image %s layers: %w", i.name, err)
	}
	size, err := blobBytes(i.dir)
	if err != nil {
		return Info{}, fmt.Errorf("image %s size: %w", i.name, err)
	}
	return Info{Name: i.name, Digest: i.Digest(), Platform: i.Platform(), Layers: len(layers),
		Size: size, Created: i.Created(), Config: i.cfg, Dir: i.dir}, nil
}

func blobBytes(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(filepath.Join(dir, "blobs"), func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			total += fi.Size()
		}
		return nil
	})
	return total, err
}

// List returns the images in the cache at root ("" means DefaultRoot),
// sorted by name. A missing root is an empty cache.
func List(root string) ([]Info, error) {
	root = rootOrDefault(root)
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var out []Info
	for _, e := range ents {
		if !e.IsDir() || ValidName(e.Name()) != nil {
			continue // temporary build directories and lock files start with "."
		}
		img, err := Open(filepath.Join(root, e.Name()))
		if err != nil {
			return nil, err
		}
		info, err := img.Info()
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, nil
}

// pickImage returns the only image of ii, or the linux/GOARCH one of a
// multi-platform index, descending into nested indexes.
func pickImage(ii v1.ImageIndex) (v1.Image, error) {
	im, err := ii.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	var images []v1.Image
	var platforms []*v1.Platform
	for _, d := range im.Manifests {
		switch {
		case d.MediaType.IsImage():
			img, err := ii.Image(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("image %s: %w", d.Digest, err)
			}
			images = append(images, img)
			platforms = append(platforms, d.Platform)
		case d.MediaType.IsIndex():
			child, err := ii.ImageIndex(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("index %s: %w", d.Digest, err)
			}
			img, err := pickImage(child)
			if err != nil {
				return nil, err
			}
			images = append(images, img)
			platforms = append(platforms, &v1.Platform{OS: "linux", Architecture: runtime.GOARCH})
		}
	}
	if len(images) == 1 {
		return images[0], nil
	}
	for k, p := range platforms {
		if p != nil && p.OS == "linux" && p.Architecture == runtime.GOARCH {
			return images[k], nil
		}
	}
	if len(images) == 0 {
		return nil, fmt.Errorf("no image in index: %w", ErrNotFound)
	}
	return nil, fmt.Errorf("%d images in index and none for linux/%s", len(images), runtime.GOARCH)
}
