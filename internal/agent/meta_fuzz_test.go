package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/migration"
)

func metaSeed(tb testing.TB) []byte {
	tb.Helper()
	m := meta{Name: "web", Image: "wordpress", Digest: "sha256:" + string(bytes.Repeat([]byte("ab"), 32)), IP: "10.88.0.5", MAC: "02:42:0a:58:00:05",
		Args: []string{"apache2-foreground"}, Env: []string{"PATH=/usr/bin"}, Cwd: "/var/www/html", Created: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC),
		Process: migration.Process{User: "www-data", UID: 33, GID: 33, Ports: []string{"80/tcp"}, ShmInLayer: true, CapAdd: []string{"CAP_NET_RAW"}}}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestDecodeMeta(t *testing.T) {
	b := metaSeed(t)
	m, err := decodeMeta(b)
	if err != nil || m.Name != "web" || m.UID != 33 {
		t.Fatalf("decodeMeta: %+v, %v", m, err)
	}
	// Written by an agent of before the cgroupfs skeletons: still read.
	old := append(bytes.TrimSuffix(bytes.TrimSpace(b), []byte("}")), []byte(`, "cgroup_binds": true}`)...)
	if _, err := decodeMeta(old); err != nil {
		t.Errorf("meta with the retired cgroup_binds: %v", err)
	}
	for name, in := range map[string][]byte{
		"unknown field": append(bytes.TrimSuffix(bytes.TrimSpace(b), []byte("}")), []byte(`, "uid_override": 0}`)...),
		"trailing data": append(append([]byte{}, b...), []byte(`{}`)...),
		"bad name":      []byte(`{"name":"../etc"}`),
	} {
		if _, err := decodeMeta(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// FuzzMeta: a meta.json read at start (loadContainers, readMeta) never
// panics the agent; a refusal wraps ErrInvalid, and what decodes
// re-encodes (as writeMeta writes it) to a file that decodes the same.
func FuzzMeta(f *testing.F) {
	f.Add(metaSeed(f))
	f.Add([]byte(`{"name":"x","cgroup_binds":true}`))
	f.Add([]byte(`{"name":"x"}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		re, err := json.MarshalIndent(m, "", "  ")
		if err != nil {
			return // a time past year 9999 decodes but does not encode
		}
		m2, err := decodeMeta(re)
		if err != nil {
			t.Fatalf("writeMeta's encoding %s does not decode: %v", re, err)
		}
		if re2, _ := json.MarshalIndent(m2, "", "  "); !bytes.Equal(re, re2) {
			t.Fatalf("%s re-encodes as %s", re, re2)
		}
	})
}
