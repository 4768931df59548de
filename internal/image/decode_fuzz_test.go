package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// layoutSeed is a real image's config and manifest as an OCI layout
// holds them (one empty layer).
func layoutSeed(tb testing.TB) (manifest, config []byte) {
	tb.Helper()
	layer := tarBytes(tb, tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	cfg := v1.ConfigFile{Architecture: "amd64", OS: "linux", Config: v1.Config{User: "www-data", Cmd: []string{"apache2-foreground"},
		Env: []string{"PATH=/usr/bin"}, WorkingDir: "/var/www/html", ExposedPorts: map[string]struct{}{"80/tcp": {}}, StopSignal: "SIGWINCH"},
		RootFS: v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{sha(layer)}}}
	config, err := json.Marshal(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	m := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1,
		Config: v1.Descriptor{MediaType: types.OCIConfigJSON, Size: int64(len(config)), Digest: sha(config)},
		Layers: []v1.Descriptor{{MediaType: types.OCILayer, Size: int64(len(layer)), Digest: sha(layer)}}}
	if manifest, err = json.Marshal(m); err != nil {
		tb.Fatal(err)
	}
	return manifest, config
}

func tarBytes(tb testing.TB, hs ...tar.Header) []byte {
	tb.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hs {
		if err := tw.WriteHeader(&h); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

func sha(b []byte) v1.Hash {
	s := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(s[:])}
}

func indexFor(tb testing.TB, manifest []byte) []byte {
	tb.Helper()
	b, err := json.Marshal(v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex,
		Manifests: []v1.Descriptor{{MediaType: types.OCIManifestSchema1, Size: int64(len(manifest)), Digest: sha(manifest)}}})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// FuzzOCILayout: an OCI layout's index, manifest and config (an imported
// image's, or the cache's) never panic Open; a layout that opens names
// the manifest by its content's digest when the index is the one made
// for it, and its config re-encodes to one that parses the same.
func FuzzOCILayout(f *testing.F) {
	manifest, config := layoutSeed(f)
	f.Add([]byte(nil), manifest, config)
	f.Add(indexFor(f, manifest), manifest, config)
	f.Add([]byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:00","size":1}]}`), manifest, config)
	f.Fuzz(func(t *testing.T, index, manifest, config []byte) {
		dir := t.TempDir()
		blobs := filepath.Join(dir, "blobs", "sha256")
		if err := os.MkdirAll(blobs, 0o755); err != nil {
			t.Fatal(err)
		}
		made := len(index) == 0
		if made {
			index = indexFor(t, manifest)
		}
		for name, b := range map[string][]byte{
			filepath.Join(dir, "oci-layout"):        []byte(`{"imageLayoutVersion":"1.0.0"}`),
			filepath.Join(dir, "index.json"):        index,
			filepath.Join(blobs, sha(manifest).Hex): manifest,
			filepath.Join(blobs, sha(config).Hex):   config,
		} {
			if err := os.WriteFile(name, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		img, err := Open(dir)
		if err != nil {
			return
		}
		if made && img.Digest() != sha(manifest).String() {
			t.Fatalf("digest %s, the manifest's is %s", img.Digest(), sha(manifest))
		}
		re, err := json.Marshal(img.file)
		if err != nil {
			t.Fatalf("config does not re-encode: %v", err)
		}
		cf, err := v1.ParseConfigFile(bytes.NewReader(re))
		if err != nil || !reflect.DeepEqual(cf.Config.User, img.Config().User) || !reflect.DeepEqual(cf.Config.Cmd, img.Config().Cmd) {
			t.Fatalf("re-encoded config %s: %+v, %v", re, cf, err)
		}
		if ls, err := img.img.Layers(); err == nil {
			for _, l := range ls {
				_, _ = l.Digest()
				_, _ = l.Size()
			}
		}
	})
}

// FuzzDockerSave: a `docker save` tarball's manifest.json and config
// never panic Import's reading of it; a tar without manifest.json is
// ErrUnknownFormat.
func FuzzDockerSave(f *testing.F) {
	_, config := layoutSeed(f)
	layer := tarBytes(f, tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	manifest, err := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{"wordpress:latest"}, "Layers": []string{"layer.tar"}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(manifest, config, true)
	f.Add([]byte(`[{"Config":"config.json","Layers":["missing.tar"]}]`), config, true)
	f.Add(manifest, config, false)
	f.Fuzz(func(t *testing.T, manifest, config []byte, withManifest bool) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		files := []struct {
			name string
			b    []byte
		}{{"config.json", config}, {"layer.tar", layer}}
		if withManifest {
			files = append(files, struct {
				name string
				b    []byte
			}{"manifest.json", manifest})
		}
		for _, e := range files {
			if err := tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(e.b))}); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write(e.b); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		src := filepath.Join(dir, "save.tar")
		if err := os.WriteFile(src, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		img, err := readSource(context.Background(), src, dir, 1<<20)
		if !withManifest {
			if !errors.Is(err, ErrUnknownFormat) {
				t.Fatalf("no manifest.json: %v, want ErrUnknownFormat", err)
			}
			return
		}
		if err != nil {
			return
		}
		_, _ = img.Digest()
		_, _ = img.Manifest()
		if cf, err := img.ConfigFile(); err == nil {
			if _, err := json.Marshal(cf); err != nil {
				t.Fatalf("config does not re-encode: %v", err)
			}
		}
		if ls, err := img.Layers(); err == nil {
			for _, l := range ls {
				_, _ = l.Digest()
			}
		}
	})
}

// TestLayoutSeedOpens: the fuzz seeds are images Open and readSource
// accept, so the fuzzers' invariants are exercised from the start.
func TestLayoutSeedOpens(t *testing.T) {
	manifest, config := layoutSeed(t)
	dir := t.TempDir()
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		filepath.Join(dir, "oci-layout"):        []byte(`{"imageLayoutVersion":"1.0.0"}`),
		filepath.Join(dir, "index.json"):        indexFor(t, manifest),
		filepath.Join(blobs, sha(manifest).Hex): manifest,
		filepath.Join(blobs, sha(config).Hex):   config,
	} {
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img, err := Open(dir)
	if err != nil || img.Config().User != "www-data" || img.Digest() != sha(manifest).String() {
		t.Fatalf("seed layout: %v", err)
	}
}
