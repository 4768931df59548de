package agent

import (
	"context"
	"testing"
	"time"
)

func TestFDBClock(t *testing.T) {
	var c fdbClock
	t0 := time.Unix(100, 0)
	const mac = "0a:58:0a:c8:01:01"
	c.Lock()
	defer c.Unlock()
	if c.superseded(mac, t0) {
		t.Fatal("an endpoint never announced is superseded")
	}
	// A list read began at t0; an announcement came at t0+1s: the list is
	// stale for this MAC, not for others, and not for a later read.
	c.announced(mac, t0.Add(time.Second))
	if !c.superseded(mac, t0) {
		t.Error("a list read older than the announcement overrides it")
	}
	if c.superseded("0a:58:0a:c8:01:02", t0) {
		t.Error("another MAC is superseded")
	}
	if c.superseded(mac, t0.Add(2*time.Second)) {
		t.Error("a list read newer than the announcement is stale")
	}
	// An older stamp does not move the clock back.
	c.announced(mac, t0)
	if !c.superseded(mac, t0.Add(500*time.Millisecond)) {
		t.Error("an older announcement moved the clock back")
	}
}

// TestEndpointsSkipHandedOver: a service whose migration has handed its
// traffic to the destination is not listed, so a peer reading the list
// does not point its FDB back at this node; after a rollback it is.
func TestEndpointsSkipHandedOver(t *testing.T) {
	a := &Agent{cfg: Config{Node: "node0"}, containers: map[string]*container{
		"a": {meta: meta{Name: "a", IP: "10.200.1.1", MAC: "0a:58:0a:c8:01:01"}},
		"b": {meta: meta{Name: "b", IP: "10.200.1.2", MAC: "0a:58:0a:c8:01:02"}},
	}}
	names := func() map[string]bool {
		out := map[string]bool{}
		for _, e := range a.Endpoints() {
			out[e.Name] = true
		}
		return out
	}
	if got := names(); !got["a"] || !got["b"] {
		t.Fatalf("endpoints %v, want a and b", got)
	}
	a.setHandedOver(a.containers["a"], true)
	if got := names(); got["a"] || !got["b"] {
		t.Fatalf("endpoints while a is handed over: %v, want only b", got)
	}
	a.setHandedOver(a.containers["a"], false)
	if got := names(); !got["a"] {
		t.Fatalf("endpoints after the rollback: %v, want a back", got)
	}
}

// awaitSince returns once an announcement about the MAC is applied after
// the given time, and not for an older one or another MAC.
func TestFDBClockAwaitSince(t *testing.T) {
	var c fdbClock
	mac := "02:00:0a:c8:01:02"
	t0 := time.Now()
	c.stamp(mac, t0.Add(-time.Second)) // before: does not count
	if c.awaitSince(context.Background(), mac, t0, 20*time.Millisecond) {
		t.Fatal("an announcement older than the handover counted")
	}
	done := make(chan bool, 1)
	go func() { done <- c.awaitSince(context.Background(), mac, t0, 5*time.Second) }()
	time.Sleep(10 * time.Millisecond)
	c.stamp("02:00:0a:c8:01:03", time.Now()) // another MAC
	select {
	case <-done:
		t.Fatal("another MAC's announcement counted")
	case <-time.After(20 * time.Millisecond):
	}
	c.stamp(mac, time.Now())
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("the announcement did not count")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("not woken by the announcement")
	}
}
