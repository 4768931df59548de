package image

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"
)

// ErrUnknownFormat is returned by Import for a source that is neither an
// OCI image layout nor a `docker save` or OCI archive tarball.
var ErrUnknownFormat = errors.New("not an OCI layout, OCI archive or docker save tarball")

// ErrTooLarge is wrapped by Import's refusal of a source larger than its
// bound.
var ErrTooLarge = errors.New("image source too large")

// DefaultImportLimit is Import's bound on a source when none is given:
// far above the services edge nodes run, far below a node's disk.
const DefaultImportLimit = 8 << 30

// Import copies the image at src into the cache at root ("" means
// DefaultRoot) under name, replacing an image of that name atomically.
// src is an OCI image layout directory, or a tar file (optionally gzipped)
// holding an OCI layout (`podman save --format oci-archive`) or made by
// `docker save` (one image). A multi-platform source contributes its
// linux/GOARCH image. maxBytes (<= 0: DefaultImportLimit) bounds the
// source as read: the tar file, its decompressed copy, the OCI archive's
// files, a layout directory's files (ErrTooLarge past it), so that a
// gzip bomb or an endless archive cannot fill the node's disk.
func Import(ctx context.Context, root, name, src string, maxBytes int64) (*Image, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultImportLimit
	}
	if err := ValidName(name); err != nil {
		return nil, err
	}
	root = rootOrDefault(root)
	release, err := lockName(ctx, root, name)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", name, err)
	}
	defer release()
	work, err := workDir(root, name)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", name, err)
	}
	defer os.RemoveAll(work)

	img, err := readSource(ctx, src, work, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("import %s from %s: %w", name, src, err)
	}
	if _, err := install(ctx, root, name, img); err != nil {
		return nil, fmt.Errorf("import %s from %s: %w", name, src, err)
	}
	return Resolve(root, name)
}

// readSource opens src as an image, using work for any temporary files.
func readSource(ctx context.Context, src, work string, maxBytes int64) (v1.Image, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return nil, err
	}
	tooLarge := func(what string) error {
		return fmt.Errorf("%w: %s is more than %d bytes (the import's bound; raise it with --max-size)", ErrTooLarge, what, maxBytes)
	}
	if fi.IsDir() {
		var n int64
		err := filepath.WalkDir(src, func(_ string, d os.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			info, err := d.Info()
			if err == nil {
				if n += info.Size(); n > maxBytes {
					return tooLarge("the layout's content")
				}
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		return readLayout(src)
	}
	if fi.Size() > maxBytes {
		return nil, tooLarge(src)
	}
	tarPath, err := gunzipIfNeeded(src, filepath.Join(work, "source.tar"), maxBytes)
	if errors.Is(err, ErrTooLarge) {
		return nil, tooLarge(src + " decompressed")
	}
	if err != nil {
		return nil, err
	}
	names, err := tarNames(tarPath)
	if err != nil {
		return nil, err
	}
	switch {
	case names["oci-layout"] && names["index.json"]:
		dir := filepath.Join(work, "oci")
		if err := extractPlain(ctx, tarPath, dir, maxBytes); errors.Is(err, ErrTooLarge) {
			return nil, tooLarge("the OCI archive's content")
		} else if err != nil {
			return nil, err
		}
		return readLayout(dir)
	case names["manifest.json"]:
		img, err := tarball.ImageFromPath(tarPath, nil)
		if err != nil {
			return nil, fmt.Errorf("docker save tarball: %w", err)
		}
		return img, nil
	}
	return nil, ErrUnknownFormat
}

func readLayout(dir string) (v1.Image, error) {
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnknownFormat, err)
	}
	ii, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	return pickImage(ii)
}

// gunzipIfNeeded returns src, or, when src is gzip-compressed, the path of
// its decompressed copy at dst (tarball readers need to seek).
func gunzipIfNeeded(src, dst string, maxBytes int64) (string, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	magic, err := br.Peek(2)
	if err != nil || magic[0] != 0x1f || magic[1] != 0x8b {
		return src, nil
	}
	zr, err := gzip.NewReader(br)
	if err != nil {
		return "", err
	}
	out, err := os.Create(dst)
	if err != nil {
		return "", err
	}
	n, err := io.Copy(out, io.LimitReader(zr, maxBytes+1))
	if err == nil && n > maxBytes {
		err = ErrTooLarge
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("decompress: %w", err)
	}
	return dst, nil
}

// tarNames returns the cleaned names of the entries in the tar at p.
func tarNames(p string) (map[string]bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnknownFormat, err)
		}
		names[path.Clean(hdr.Name)] = true
	}
}

// extractPlain unpacks a tar holding only directories and regular files
// (an OCI archive) into dir, refusing any name that leaves it.
func extractPlain(ctx context.Context, tarPath, dir string, maxBytes int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	f, err := os.Open(tarPath)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		if name == "." {
			continue
		}
		if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if total += hdr.Size; hdr.Size < 0 || total > maxBytes {
				return ErrTooLarge
			}
			w, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(w, tr)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: unexpected entry %q in OCI archive", ErrUnknownFormat, hdr.Name)
		}
	}
}
