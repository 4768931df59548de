package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// moveEntries keeps the destination directory itself (runc holds it
// open), replaces an entry of the same name, and removes the source.
func TestMoveEntries(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "in-images"), filepath.Join(dir, "in")
	for _, d := range []string{src, dst, filepath.Join(src, "sub")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range map[string]string{
		filepath.Join(dst, "descriptors.json"): "old",
		filepath.Join(src, "descriptors.json"): "new",
		filepath.Join(src, "core-1.img"):       "core",
		filepath.Join(src, "sub", "x"):         "x",
	} {
		if err := os.WriteFile(name, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	held, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := moveEntries(src, dst); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"descriptors.json": "new", "core-1.img": "core", "sub/x": "x"} {
		if b, err := os.ReadFile(filepath.Join(dst, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", name, b, err, want)
		}
	}
	if _, err := os.Stat(src); !os.IsNotExist(err) {
		t.Errorf("source directory left: %v", err)
	}
	// The directory runc holds open is the one that got the entries.
	names, err := held.Readdirnames(-1)
	if err != nil || len(names) != 3 {
		t.Errorf("entries seen through the held directory: %v, %v", names, err)
	}
}
