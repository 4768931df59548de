package image

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

const testPasswd = `root:x:0:0:root:/root:/bin/bash
# a comment
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
broken line
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
memcache:x:100:101::/nonexistent:/usr/sbin/nologin
`

const testGroup = `root:x:0:
daemon:x:1:
memcache:x:101:
audio:x:29:memcache,daemon
video:x:44:daemon
nogroup:x:65534:
`

func idRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"passwd": testPasswd, "group": testGroup} {
		if err := os.WriteFile(filepath.Join(root, "etc", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestLookupUser(t *testing.T) {
	root := idRoot(t)
	for _, c := range []struct {
		spec string
		want IDs
	}{
		{"", IDs{}},
		{"nobody", IDs{UID: 65534, GID: 65534}},
		{"memcache", IDs{UID: 100, GID: 101, Groups: []uint32{29}}},
		{"daemon:video", IDs{UID: 1, GID: 44, Groups: []uint32{29}}},
		{"100", IDs{UID: 100, GID: 101, Groups: []uint32{29}}},
		{"4242", IDs{UID: 4242, GID: 0}},
		{"4242:4343", IDs{UID: 4242, GID: 4343}},
		{"nobody:0", IDs{UID: 65534, GID: 0}},
	} {
		got, err := LookupUser(root, c.spec)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("LookupUser(%q) = %+v, %v; want %+v", c.spec, got, err, c.want)
		}
	}
	for _, spec := range []string{"alice", "nobody:staff", ":1", "nobody:"} {
		if got, err := LookupUser(root, spec); err == nil {
			t.Errorf("LookupUser(%q) = %+v, want an error", spec, got)
		}
	}
	if _, err := LookupUser(root, "alice"); !errors.Is(err, ErrUnknownUser) {
		t.Errorf("unknown user: %v", err)
	}
}

// A link in the image cannot make the lookup read the host's files.
func TestLookupUserStaysInTheImage(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(host, []byte("hostonly:x:7:7::/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(root, "etc", "passwd")); err != nil {
		t.Fatal(err)
	}
	if ids, err := LookupUser(root, "hostonly"); err == nil {
		t.Fatalf("resolved a user from outside the image: %+v", ids)
	}
	// Without an /etc/passwd, numeric ids still work.
	if ids, err := LookupUser(t.TempDir(), "12:34"); err != nil || ids.UID != 12 || ids.GID != 34 {
		t.Fatalf("numeric ids without passwd: %+v, %v", ids, err)
	}
}

// FuzzIDFiles reads arbitrary /etc/passwd and /etc/group contents from an
// image: never a panic, and a user found by name has the name's entry.
func FuzzIDFiles(f *testing.F) {
	f.Add([]byte(testPasswd), []byte(testGroup), "memcache")
	f.Add([]byte("a:b:c"), []byte(":::"), "0:0")
	f.Add([]byte("x:x:4294967295:4294967296:\n"), []byte("g:x:1:x,,y\n"), "x:g")
	f.Fuzz(func(t *testing.T, passwd, group []byte, spec string) {
		root := t.TempDir()
		if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		_ = os.WriteFile(filepath.Join(root, "etc", "passwd"), passwd, 0o644)
		_ = os.WriteFile(filepath.Join(root, "etc", "group"), group, 0o644)
		ids, err := LookupUser(root, spec)
		if err != nil {
			return
		}
		if _, ok := numericID(spec); !ok && spec != "" && !containsColon(spec) {
			e, found := findPasswd(passwd, func(e passwdEntry) bool { return e.name == spec })
			if !found || e.uid != ids.UID {
				t.Fatalf("%q resolved to %+v without its passwd entry", spec, ids)
			}
		}
	})
}

func containsColon(s string) bool {
	for _, c := range s {
		if c == ':' {
			return true
		}
	}
	return false
}
