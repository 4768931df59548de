package testbed

import "testing"

func TestPathRate(t *testing.T) {
	st := &State{
		Nodes: []Member{
			{Name: "node0", Link: Link{RateBps: 1e9}},
			{Name: "node1", Link: Link{RateBps: 100e6}},
			{Name: "node2"},
		},
		Clients: []Member{{Name: "client0", Link: Link{RateBps: 50e6}}},
	}
	for _, c := range []struct {
		a, b string
		want uint64
	}{
		{"node0", "node1", 100e6},
		{"node1", "node0", 100e6},
		{"node0", "node2", 1e9}, // an unshaped side does not limit
		{"node2", "node2", 0},
		{"client0", "node0", 50e6},
		{"node0", "nodeX", 0},
	} {
		if got := st.PathRate(c.a, c.b); got != c.want {
			t.Errorf("PathRate(%s, %s) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
