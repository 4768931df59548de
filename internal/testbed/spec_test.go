package testbed

import (
	"errors"
	"testing"
	"time"
)

func TestSpecValidate(t *testing.T) {
	ok := DefaultSpec("tb1", 3, 2)
	if err := ok.Validate(); err != nil {
		t.Fatalf("default spec invalid: %v", err)
	}
	bad := []func(*Spec){
		func(s *Spec) { s.Name = "Bad Name" },
		func(s *Spec) { s.Nodes = nil },
		func(s *Spec) { s.Clients[0].Name = s.Nodes[0].Name },
		func(s *Spec) { s.Nodes[1].Name = "core" },
		func(s *Spec) { s.Clients[0].Name = "controller" },
		func(s *Spec) { s.Nodes[0].Link.Delay = -time.Millisecond },
		func(s *Spec) { s.Nodes[0].Link.Jitter = 2 * s.Nodes[0].Link.Delay },
		func(s *Spec) { s.Clients[1].Link.Loss = 1.5 },
		func(s *Spec) { s.Nodes[0].Link.RateBps = 100 },
	}
	for i, mutate := range bad {
		s := DefaultSpec("tb1", 3, 2)
		mutate(&s)
		if err := s.Validate(); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("case %d: Validate() = %v, want ErrInvalidSpec", i, err)
		}
	}
}

func TestAddressPlan(t *testing.T) {
	seen := map[string]string{}
	for k := 0; k < MaxNodes; k++ {
		for what, a := range map[string]string{"node": NodeAddr(k).String(), "nodecore": NodeCoreAddr(k).String(),
			"client": ClientAddr(k).String(), "clientcore": ClientCoreAddr(k).String()} {
			if prev, dup := seen[a]; dup {
				t.Fatalf("%s %d address %s also used by %s", what, k, a, prev)
			}
			seen[a] = what
		}
		r := NodeRange(k)
		if !OverlayPrefix.Contains(r.Addr()) || r.Contains(OverlayGW) {
			t.Fatalf("node %d range %v: outside the overlay or holds the gateway", k, r)
		}
	}
	if NodeRange(0).Overlaps(NodeRange(1)) {
		t.Fatal("node ranges overlap")
	}
}
