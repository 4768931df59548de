package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// answerSeeds are real answers as agents encode them.
func answerSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	var out [][]byte
	for _, v := range []any{
		[]Endpoint{{Name: "web", IP: "10.88.0.5", MAC: "02:42:0a:58:00:05", VTEP: "192.168.100.11", Node: "node1"}},
		PeerPhase{ID: "0123456789abcdef", Role: "source", Phase: "committed"},
		Info{Node: "node0", Role: "node", VTEP: "192.168.100.10", API: "192.168.100.10:7070", Version: "v0.9"},
	} {
		b, err := json.Marshal(v)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func TestDecodeAnswer(t *testing.T) {
	var p PeerPhase
	if err := DecodeAnswer(strings.NewReader(`{"id":"x","phase":"done","future_field":1}`+"\n"), &p); err != nil || p.Phase != "done" {
		t.Errorf("unknown field: %+v, %v; want tolerated", p, err)
	}
	for _, in := range []string{`{"id":"x"} {"id":"y"}`, `{"id":"x"}garbage`, `{"id":1}`, ``, `{"id":"x"`} {
		if err := DecodeAnswer(strings.NewReader(in), &p); !errors.Is(err, ErrBadAnswer) {
			t.Errorf("%q: %v, want ErrBadAnswer", in, err)
		}
	}
	big := `{"id":"` + strings.Repeat("a", MaxAnswer) + `"}`
	if err := DecodeAnswer(strings.NewReader(big), &p); !errors.Is(err, ErrBadAnswer) || !strings.Contains(err.Error(), "more than") {
		t.Errorf("oversized answer: %v", err)
	}
}

// FuzzAnswers: a peer's answer (endpoints, a journaled phase, its info)
// never panics the client; a refusal wraps ErrBadAnswer, and what
// decodes re-encodes to what decodes the same.
func FuzzAnswers(f *testing.F) {
	for _, s := range answerSeeds(f) {
		f.Add(s)
	}
	f.Add([]byte(`{"id":"x"} trailing`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, newOut := range []func() any{
			func() any { return new([]Endpoint) },
			func() any { return new(PeerPhase) },
			func() any { return new(Info) },
		} {
			v := newOut()
			if err := DecodeAnswer(bytes.NewReader(b), v); err != nil {
				if !errors.Is(err, ErrBadAnswer) {
					t.Fatalf("error %v does not wrap ErrBadAnswer", err)
				}
				continue
			}
			re, err := json.Marshal(v)
			if err != nil {
				t.Fatalf("re-encode %T: %v", v, err)
			}
			w := newOut()
			if err := DecodeAnswer(bytes.NewReader(re), w); err != nil || !reflect.DeepEqual(v, w) {
				t.Fatalf("%T re-encoded as %s decodes to %v (%v), was %v", v, re, w, err, v)
			}
		}
	})
}
