package agent

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/edgehop/edgehop/internal/migration"
)

func TestCheckPrepareUser(t *testing.T) {
	lower := t.TempDir()
	if err := os.MkdirAll(filepath.Join(lower, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]string{
		"passwd": "root:x:0:0::/root:/bin/sh\nwww-data:x:33:33::/var/www:/bin/sh\n",
		"group":  "root:x:0:\nwww-data:x:33:\ntty:x:5:www-data\n",
	} {
		if err := os.WriteFile(filepath.Join(lower, "etc", name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a := &Agent{cfg: Config{ImageRoot: t.TempDir()}}
	prep := func(user string, uid, gid uint32, groups ...uint32) migration.Prepare {
		return migration.Prepare{From: "node0", Image: "wordpress", Digest: "sha256:0000",
			Process: migration.Process{User: user, UID: uid, GID: gid, Groups: groups}}
	}
	for _, tc := range []struct {
		name string
		p    migration.Prepare
		ok   bool
	}{
		{"www-data as itself", prep("www-data", 33, 33, 5), true},
		{"www-data, groups not recorded", prep("www-data", 33, 33), true},
		{"root", prep("", 0, 0), true},
		{"www-data claiming uid 0", prep("www-data", 0, 33), false},
		{"www-data claiming gid 0", prep("www-data", 33, 0), false},
		{"www-data claiming group root", prep("www-data", 33, 33, 0), false},
		{"root claiming another uid", prep("", 33, 33), false},
		{"a user the image lacks", prep("mallory", 1000, 1000), false},
	} {
		err := a.checkPrepareUser(tc.p, lower)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrForbidden)) {
			t.Errorf("%s: %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestCredsPolicy(t *testing.T) {
	const defaults = 0xa00425fb // runc.DefaultCapabilities
	p, err := credsPolicy(migration.Process{UID: 33, GID: 33, CapAdd: []string{"CAP_NET_RAW"}})
	if err != nil || p.Caps != defaults|1<<13 || p.UID != 33 {
		t.Errorf("policy %+v (%#x), %v", p, p.Caps, err)
	}
}
