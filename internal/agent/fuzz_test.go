package agent

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/journal"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/netplane"
)

// FuzzPrepare decodes a peer's Prepare message as the destination does
// and validates it: whatever is accepted names a container that stays
// inside the state directory, an overlay address with its own MAC, and
// a sender that is the authenticated peer.
func FuzzPrepare(f *testing.F) {
	ok := migration.Prepare{ID: journal.NewID(), Name: "redis", Image: "services", Digest: "sha256:" + strings.Repeat("ab", 32),
		IP: "10.200.1.5", MAC: netplane.MACFor(netip.MustParseAddr("10.200.1.5")).String(), Args: []string{"redis-server"},
		Strategy: migration.StopAndCopy, From: "node1", MemoryBytes: 1 << 20}
	b, _ := json.Marshal(ok)
	f.Add(b)
	f.Add([]byte(`{"name":"../../..","from":"node1"}`))
	f.Add([]byte(`{}`))
	p := newPeerAPI(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		var m migration.Prepare
		if err := decodeStrict(in, &m); err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("decode error is not ErrInvalid: %v", err)
			}
			return
		}
		if err := p.a.validatePrepare(m, "node1"); err != nil {
			return
		}
		if !containerNameRE.MatchString(m.Name) || m.From != "node1" {
			t.Fatalf("accepted name %q from %q", m.Name, m.From)
		}
		if d := p.a.dir(m.Name); !strings.HasPrefix(d, p.a.cfg.StateDir+string(filepath.Separator)) || filepath.Clean(d) != d {
			t.Fatalf("accepted name %q maps to %s, outside %s", m.Name, d, p.a.cfg.StateDir)
		}
		ip, err := netip.ParseAddr(m.IP)
		if err != nil || !p.a.cfg.Overlay.Contains(ip) || m.MAC != netplane.MACFor(ip).String() {
			t.Fatalf("accepted address %q with MAC %q", m.IP, m.MAC)
		}
	})
}

// FuzzOperatorRequests decodes operator and peer request bodies: a body
// decodes into its type or fails with ErrInvalid, never anything else.
func FuzzOperatorRequests(f *testing.F) {
	f.Add([]byte(`{"name":"r","image":"services","args":["redis-server"]}`))
	f.Add([]byte(`{"to":"node1","strategy":"pre-copy","rounds":3}`))
	f.Add([]byte(`{"name":"r","ip":"10.200.1.5","mac":"02:00:0a:c8:01:05","vtep":"172.30.0.2","node":"node0"}`))
	f.Add([]byte(`{"to":"node1"} {"to":"node2"}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, v := range []any{&api.RunRequest{}, &api.MigrateRequest{}, &api.Endpoint{}} {
			if err := decodeStrict(in, v); err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("decode %T: error is not ErrInvalid: %v", v, err)
			}
		}
	})
}

// FuzzLayerDelta decodes a source's LayerDelta as the destination does
// and applies it, with a fixed delta, to a live copy of a layer holding a
// link out of it: whatever the list says, the destination compares,
// rewrites in place or replaces entries under the layer only, and keeps
// no entry the list leaves out.
func FuzzLayerDelta(f *testing.F) {
	for _, keep := range [][]string{
		{"a", "a/f", "a/l", "b"},
		{"a", "a/f"},
		{"../outside", "/etc/passwd", "a/../../outside", ""},
		{"a/l/x", "a/l", "."},
	} {
		b, _ := json.Marshal(LayerDelta{Keep: keep, Changed: 1})
		f.Add(b)
	}
	f.Add([]byte(`{"keep":null}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		var ld LayerDelta
		if json.Unmarshal(in, &ld) != nil {
			return
		}
		dir := t.TempDir()
		root, delta, outside := filepath.Join(dir, "upper"), filepath.Join(dir, "delta"), filepath.Join(dir, "outside")
		write(t, outside, []byte("outside"))
		write(t, filepath.Join(root, "a/f"), []byte("old"))
		write(t, filepath.Join(root, "b"), nil)
		if err := os.Symlink(outside, filepath.Join(root, "a/l")); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(delta, "a/f"), []byte("new"))
		m, err := matchLayer(root, delta, ld.Keep)
		if err == nil {
			_, err = m.unchanged()
		}
		if err == nil {
			_, err = m.applyInPlace()
		}
		if err == nil {
			err = applyLayerDelta(root, delta, ld.Keep)
		}
		if b, rerr := os.ReadFile(outside); rerr != nil || string(b) != "outside" {
			t.Fatalf("keep %q: the file outside the layer now %q, %v", ld.Keep, b, rerr)
		}
		ents, rerr := os.ReadDir(dir)
		if rerr != nil {
			t.Fatal(rerr)
		}
		for _, e := range ents {
			if n := e.Name(); n != "upper" && n != "delta" && n != "outside" {
				t.Fatalf("keep %q: %s made outside the layer", ld.Keep, n)
			}
		}
		if err != nil {
			return // an inconsistent list fails; it touched nothing outside
		}
		want := map[string]bool{"a": true, "a/f": true}
		for _, p := range ld.Keep {
			want[filepath.Clean(p)] = true
		}
		got, lerr := listLayer(root)
		if lerr != nil {
			t.Fatal(lerr)
		}
		for _, p := range got.paths() {
			if !want[p] {
				t.Fatalf("keep %q: %s kept", ld.Keep, p)
			}
		}
		if b, _ := os.ReadFile(filepath.Join(root, "a/f")); string(b) != "new" {
			t.Fatalf("keep %q: a/f holds %q after the delta", ld.Keep, b)
		}
	})
}

// FuzzPeerMessages decodes the control messages a peer sends after the
// Prepare as both sides do (peerMessage.as): strictly, so whatever
// decodes re-encodes to a body that decodes to the same value, and an
// abort's reason is bounded.
func FuzzPeerMessages(f *testing.F) {
	types := []struct {
		typ string
		new func() any
	}{
		{migration.MsgPrepared, func() any { return &migration.ReadyNotice{} }},
		{migration.MsgLiveLayer, func() any { return &migration.LiveLayer{} }},
		{migration.MsgRound, func() any { return &migration.RoundStart{} }},
		{migration.MsgStored, func() any { return &migration.RoundStart{} }},
		{migration.MsgFrozen, func() any { return &migration.FreezeNotice{} }},
		{migration.MsgSwitched, func() any { return &migration.Switched{} }},
	}
	for i, tc := range types {
		b, _ := json.Marshal(tc.new())
		f.Add(uint8(i), b)
	}
	f.Add(uint8(5), []byte(`{"network_ms":3,"held":2}`))
	f.Add(uint8(0), []byte(`{"unknown":1}`))
	f.Add(uint8(255), []byte(`{"reason":"`+strings.Repeat("x", 5000)+`"}`))
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		if int(which) >= len(types) {
			err := peerMessage{typ: migration.MsgAbort, body: body}.as(migration.MsgSwitched, nil)
			var pa *peerAbort
			if !errors.As(err, &pa) {
				t.Fatalf("abort: %v, want a *peerAbort", err)
			}
			if !strings.HasPrefix(pa.reason, "(unreadable abort") && len(pa.reason) > 4096+len("…") {
				t.Fatalf("abort reason of %d bytes kept", len(pa.reason))
			}
			return
		}
		tc := types[which]
		v := tc.new()
		if err := (peerMessage{typ: tc.typ, body: body}).as(tc.typ, v); err != nil {
			if !strings.HasPrefix(err.Error(), "protocol: ") {
				t.Fatalf("decode error without its protocol prefix: %v", err)
			}
			return
		}
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		w := tc.new()
		if err := (peerMessage{typ: tc.typ, body: again}).as(tc.typ, w); err != nil {
			t.Fatalf("re-encoded %s %s does not decode: %v", tc.typ, again, err)
		}
		if b2, _ := json.Marshal(w); string(b2) != string(again) {
			t.Fatalf("%s round trip: %s then %s", tc.typ, again, b2)
		}
	})
}
