package agent

import (
	"reflect"
	"testing"

	"github.com/edgehop/edgehop/internal/api"
)

func TestHeartbeatOf(t *testing.T) {
	cs := []api.Container{
		{Name: "redis", Status: "running", MemoryBytes: 10},
		{Name: "db", Status: "running", Group: "app", MemoryBytes: 300},
		{Name: "web", Status: "running", Group: "app", MemoryBytes: 100},
		{Name: "old", Status: "stopped", MemoryBytes: 0},
		{Name: "q", Status: "running", Group: "pod", MemoryBytes: 7},
		{Name: "w", Status: "running", Group: "pod", MemoryBytes: 5},
		{Name: "half", Status: "running", Group: "split"},
		{Name: "gone", Status: "stopped", Group: "split"},
	}
	hb := heartbeatOf("node0", "172.30.0.2", cs, map[string]bool{"w": true})
	want := api.Heartbeat{
		Node: "node0", Address: "172.30.0.2",
		Containers: []string{"redis", "db", "web", "q", "half"},
		Groups:     []string{"app"},
		Migrating:  []string{"pod", "w"},
		// A migrating member's pod runs nowhere whole, and a group with
		// a stopped member is not whole: neither reports memory.
		MemoryBytes: map[string]int64{"redis": 10, "db": 300, "web": 100, "app": 400, "q": 7},
	}
	if !reflect.DeepEqual(hb, want) {
		t.Errorf("heartbeat\n got %+v\nwant %+v", hb, want)
	}
	if hb := heartbeatOf("node1", "", nil, nil); hb.MemoryBytes != nil || hb.Containers != nil {
		t.Errorf("empty node: %+v", hb)
	}
}
