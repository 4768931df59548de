package linux

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// unixImportAllowed are the files outside this package still allowed to
// import golang.org/x/sys/unix, by path from the module root.
//
// TODO(agent): move layer.go's calls (the lstat/fstat walks of a
// container's writable layer, with the raw Stat_t fields they compare,
// and copyXattrs' list/get/set/remove of extended attributes) into this
// package, then its test's. They are about 50 calls in the frozen
// window's layer diff, in a package others were editing when the rest
// moved: they need a Stat type and xattr calls here that cost what the
// direct calls cost, not a mechanical rename.
var unixImportAllowed = []string{
	"internal/agent/layer.go",
	"internal/agent/layer_test.go",
}

// TestUnixImportsOnlyHere: every golang.org/x/sys/unix call is in this
// package (see doc.go); the test names each other file of the module
// that imports it.
func TestUnixImportsOnlyHere(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var found []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); path != root && err == nil {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if strings.HasPrefix(rel, "internal/linux/") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == "golang.org/x/sys/unix" {
				found = append(found, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range found {
		if !slices.Contains(unixImportAllowed, rel) {
			t.Errorf("%s imports golang.org/x/sys/unix: call a function of internal/linux instead", rel)
		}
	}
	for _, rel := range unixImportAllowed {
		if !slices.Contains(found, rel) {
			t.Errorf("%s no longer imports golang.org/x/sys/unix: take it off unixImportAllowed", rel)
		}
	}
}

// moduleRoot is the directory of the go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", os.ErrNotExist
		}
		dir = parent
	}
}
