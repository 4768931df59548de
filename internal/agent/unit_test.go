package agent

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/journal"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/netplane"
	"github.com/edgehop/edgehop/internal/testutil"
)

// The members of a unit pass a barrier together; one failing makes the
// others waiting there give up with its reason.
func TestUnitBarriers(t *testing.T) {
	u := newUnit("app", []string{"db", "web"})
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- u.arrive(ctx, stageFreeze, 100<<20) }()
	select {
	case err := <-done:
		t.Fatalf("passed the barrier alone: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := u.arrive(ctx, stageFreeze, 300<<20); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	go func() { done <- u.arrive(ctx, stageSent, 0) }()
	time.Sleep(20 * time.Millisecond)
	u.fail("web", errors.New("restore refused"))
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "web failed: restore refused") {
			t.Fatalf("waiter got %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a failed member left the other waiting")
	}
	// Later arrivals see the failure at once.
	if err := u.arrive(ctx, stageSent, 0); err == nil {
		t.Fatal("arrived after a failure without error")
	}
	// A waiter whose context ends gives up, and fails the unit.
	v := newUnit("app", []string{"a", "b"})
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if err := v.arrive(cctx, stageFreeze, 0); err == nil {
		t.Fatal("no error when the context ended")
	}
	if err := v.arrive(ctx, stageFreeze, 0); err == nil {
		t.Fatal("the unit did not fail with its waiter's context")
	}
}

func TestUnitBudget(t *testing.T) {
	small := newUnit("g", []string{"a"})
	big := newUnit("g", []string{"a", "b"})
	ctx := context.Background()
	_ = small.arrive(ctx, stageFreeze, 10<<20)
	go func() { _ = big.arrive(ctx, stageFreeze, 10<<20) }()
	_ = big.arrive(ctx, stageFreeze, 2<<30)
	if small.budget(1e9) >= big.budget(1e9) {
		t.Errorf("budget of 10 MiB %v, of 2 GiB more %v: want the unit's state to count", small.budget(1e9), big.budget(1e9))
	}
}

// A restored member waits for the members it depends on that are part
// of the unit, not for others, and at most the given time.
func TestRestoredSet(t *testing.T) {
	var r restoredSet
	ctx := context.Background()
	if missing := r.await(ctx, "u1", []string{"db", "web"}, []string{"db", "cache"}, 30*time.Millisecond); len(missing) != 1 || missing[0] != "db" {
		t.Fatalf("missing %v, want [db] (cache is not in the unit)", missing)
	}
	got := make(chan []string, 1)
	go func() { got <- r.await(ctx, "u1", []string{"db", "web"}, []string{"db"}, 5*time.Second) }()
	time.Sleep(20 * time.Millisecond)
	r.mark("u2", "db") // another unit's db does not count
	select {
	case m := <-got:
		t.Fatalf("released by another unit's member: %v", m)
	case <-time.After(30 * time.Millisecond):
	}
	r.mark("u1", "db")
	select {
	case m := <-got:
		if len(m) != 0 {
			t.Fatalf("missing %v after db was restored", m)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("not released once db was restored")
	}
}

// The last member to arrive at stageSent records the unit's commit, once,
// before any member goes on; if recording fails, every member fails.
func TestUnitRecordsCommit(t *testing.T) {
	ctx := context.Background()
	u := newUnit("app", []string{"db", "web"})
	var calls int
	u.commit = func() error { calls++; return nil }
	done := make(chan error, 1)
	go func() { done <- u.arrive(ctx, stageSent, 0) }()
	time.Sleep(20 * time.Millisecond)
	u.mu.Lock()
	early := calls
	u.mu.Unlock()
	if early != 0 {
		t.Fatal("recorded the commit before every member had sent its state")
	}
	if err := u.arrive(ctx, stageSent, 0); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || calls != 1 {
		t.Fatalf("first member: %v; commit recorded %d times, want 1", err, calls)
	}

	v := newUnit("app", []string{"db", "web"})
	v.commit = func() error { return errors.New("disk full") }
	go func() { done <- v.arrive(ctx, stageSent, 0) }()
	time.Sleep(20 * time.Millisecond)
	err := v.arrive(ctx, stageSent, 0)
	for _, e := range []error{err, <-done} {
		if e == nil || !strings.Contains(e.Error(), "recording its commit failed: disk full") {
			t.Errorf("a member went on without the unit's commit recorded: %v", e)
		}
	}
}

// A member freezes only after the members that depend on it; a member
// nothing depends on, or one in a dependency cycle, does not wait; a
// failure releases the waiters with its reason.
func TestUnitFreezeOrder(t *testing.T) {
	u := newUnit("app", []string{"cache", "db", "web"})
	u.orderFreeze(map[string][]string{"web": {"db", "cache", "elsewhere"}, "cache": {"db"}})
	ctx := context.Background()
	if err := u.awaitDependentsFrozen(ctx, "web"); err != nil {
		t.Fatalf("web has no dependents: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- u.awaitDependentsFrozen(ctx, "db") }()
	for _, m := range []string{"web", "cache"} {
		select {
		case err := <-done:
			t.Fatalf("db went on before %s froze: %v", m, err)
		case <-time.After(30 * time.Millisecond):
		}
		u.markFrozen(m)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	cyc := newUnit("cyc", []string{"a", "b"})
	cyc.orderFreeze(map[string][]string{"a": {"b"}, "b": {"a"}})
	for _, m := range []string{"a", "b"} {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		if err := cyc.awaitDependentsFrozen(wctx, m); err != nil {
			t.Fatalf("%s in a cycle waits: %v", m, err)
		}
		cancel()
	}

	f := newUnit("app", []string{"db", "web"})
	f.orderFreeze(map[string][]string{"web": {"db"}})
	go func() { done <- f.awaitDependentsFrozen(ctx, "db") }()
	time.Sleep(20 * time.Millisecond)
	f.fail("web", errors.New("freeze failed"))
	if err := <-done; err == nil || !strings.Contains(err.Error(), "freeze failed") {
		t.Fatalf("after web failed: %v", err)
	}
}

// Of a pod's members, exactly one, the first to freeze, does the pod's
// network part, however many freeze at once.
func TestTakePodNetwork(t *testing.T) {
	u := newUnit("app", []string{"db", "web", "cache"})
	got := make(chan bool, 3)
	for range 3 {
		go func() { got <- u.takePodNetwork() }()
	}
	n := 0
	for range 3 {
		if <-got {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d members took the pod's network, want 1", n)
	}
}

// A pod is restored whole or not at all: a member waits for the others
// and gives up as soon as one's copy is given up, or at its deadline.
func TestRestoredAwaitAll(t *testing.T) {
	var r restoredSet
	ctx := context.Background()
	r.mark("u1", "db")
	done := make(chan error, 1)
	go func() { done <- r.awaitAll(ctx, "u1", []string{"db", "web"}, time.Minute) }()
	select {
	case err := <-done:
		t.Fatalf("returned before web was restored: %v", err)
	case <-time.After(30 * time.Millisecond):
	}
	r.mark("u1", "web")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.mark("u2", "db")
	go func() { done <- r.awaitAll(ctx, "u2", []string{"db", "web"}, time.Minute) }()
	time.Sleep(10 * time.Millisecond)
	r.markFailed("u2", "web")
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "[web] could not be restored") {
			t.Fatalf("got %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a given-up member left the other waiting")
	}
	// A member given up after it was restored counts as given up.
	r.markFailed("u1", "db")
	if err := r.awaitAll(ctx, "u1", []string{"db", "web"}, time.Second); err == nil {
		t.Fatal("db given up, yet the pod counts as restored")
	}
	if err := r.awaitAll(ctx, "u3", []string{"a"}, 20*time.Millisecond); err == nil || !strings.Contains(err.Error(), "not restored here within") {
		t.Fatalf("deadline: %v", err)
	}
}

// podNet places a new container: a pod's first member holds the pod's
// network, later ones share it; pods and groups do not mix.
func TestPodNet(t *testing.T) {
	a := &Agent{containers: map[string]*container{
		"db":  {meta: meta{Name: "db", IP: "10.200.1.5", Process: migration.Process{Group: "app", PodNet: "db"}}},
		"api": {meta: meta{Name: "api", IP: "10.200.1.6", Process: migration.Process{Group: "shop"}}},
	}}
	if net, owner, err := a.podNet(api.RunRequest{Name: "web", Pod: "app"}); err != nil || net != "db" || owner == nil || owner.IP != "10.200.1.5" {
		t.Errorf("joining app: %q %+v %v", net, owner, err)
	}
	if net, owner, err := a.podNet(api.RunRequest{Name: "x", Pod: "fresh"}); err != nil || net != "x" || owner != nil {
		t.Errorf("a new pod's first member: %q %+v %v", net, owner, err)
	}
	if net, _, err := a.podNet(api.RunRequest{Name: "y", Group: "shop"}); err != nil || net != "" {
		t.Errorf("joining a group: %q %v", net, err)
	}
	for name, r := range map[string]api.RunRequest{
		"a group into a pod":     {Name: "w", Group: "app"},
		"a pod into a group":     {Name: "w", Pod: "shop"},
		"a pod in another group": {Name: "w", Pod: "app", Group: "shop"},
	} {
		if _, _, err := a.podNet(r); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	delete(a.containers, "db")
	a.containers["web"] = &container{meta: meta{Name: "web", Process: migration.Process{Group: "app", PodNet: "db"}}}
	if _, _, err := a.podNet(api.RunRequest{Name: "z", Pod: "app"}); !errors.Is(err, ErrConflict) {
		t.Errorf("joining a pod whose first member is gone: %v", err)
	}
}

// A destination restarted in the middle of a pod's restore settles its
// members alike: one journaled restored is given up with another whose
// restore did not end (its container does not run); a group that is not
// a pod, and a pod all restored, are left as journaled.
func TestSettlePods(t *testing.T) {
	a := newPeerAPI(t).a
	metas := map[string]migration.Process{
		"db":   {Group: "app", PodNet: "db"},
		"web":  {Group: "app", PodNet: "db"},
		"solo": {Group: "shop"},
		"kv":   {Group: "kvpod", PodNet: "kv"},
	}
	for n, p := range metas {
		if err := os.MkdirAll(a.dir(n), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := a.writeMeta(meta{Name: n, Process: p}); err != nil {
			t.Fatal(err)
		}
	}
	pod, shop, kv := journal.NewID(), journal.NewID(), journal.NewID()
	rec := func(name, unit string, ph migration.Phase) journal.Record {
		return journal.Record{ID: journal.NewID(), Role: migration.RoleDestination, Container: name, Unit: unit, Phase: ph}
	}
	recs := []journal.Record{
		rec("db", pod, migration.Restored),
		rec("web", pod, migration.Transferred), // no container runs
		rec("solo", shop, migration.Restored),
		rec("kv", kv, migration.Restored),
	}
	got := a.settlePods(context.Background(), recs)
	want := []migration.Phase{migration.Transferred, migration.Transferred, migration.Restored, migration.Restored}
	for i, r := range got {
		if r.Phase != want[i] {
			t.Errorf("%s: settled from %s, want %s", r.Container, r.Phase, want[i])
		}
	}
}

// A pod's hold of its loopback outlives every member's migration but the
// last: the last to finish ends it (here, one did not move: let through).
func TestUnitLoopHold(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "iptables", "nsenter")
	ns := testutil.NewNetNS(t, "uloop")
	held := func() bool {
		out, err := linux.Command(ns, "iptables", "-w", "-t", "mangle", "-S", "OUTPUT").CombinedOutput()
		if err != nil {
			t.Fatalf("iptables: %v: %s", err, out)
		}
		return strings.Contains(string(out), "NFQUEUE")
	}
	u := newUnit("app", []string{"db", "web"})
	h, err := netplane.HoldLoopback(ns)
	if err != nil {
		t.Fatal(err)
	}
	u.holdLoop(h)
	log := slog.New(slog.DiscardHandler)
	u.memberDone(true, log)
	if !held() {
		t.Fatal("the hold ended with the first member's migration")
	}
	u.memberDone(false, log)
	if held() {
		t.Fatal("the hold outlived the last member's migration")
	}
}

// A group's members are created one at a time: a second claim of the
// group waits for the first's release, and another group's does not.
func TestClaimGroup(t *testing.T) {
	a := &Agent{busy: map[string]bool{}}
	ctx := context.Background()
	if err := a.claimGroup(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if err := a.claimGroup(ctx, "shop"); err != nil {
		t.Fatalf("another group waited: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- a.claimGroup(ctx, "app") }()
	select {
	case err := <-got:
		t.Fatalf("a second creation in app went ahead (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	a.release(groupKey("app"))
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second creation still waits after the first's release")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := a.claimGroup(cctx, "app"); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled wait: %v", err)
	}
}

// pickIP hands out the lowest free address, a recently released one only
// when no other is free, and one released long ago as any other.
func TestPickIPCooldown(t *testing.T) {
	rng := netip.MustParsePrefix("10.200.1.0/29") // .1-.7
	gw := netip.MustParseAddr("10.200.1.7")
	now := time.Now()
	taken := map[netip.Addr]bool{}
	isTaken := func(ip netip.Addr) bool { return taken[ip] }
	released := map[netip.Addr]time.Time{
		netip.MustParseAddr("10.200.1.1"): now.Add(-time.Minute),
		netip.MustParseAddr("10.200.1.2"): now.Add(-2 * addrCooldown),
	}
	if ip, ok := pickIP(rng, gw, isTaken, released, now); !ok || ip.String() != "10.200.1.2" {
		t.Fatalf("got %v %v, want 10.200.1.2 (released long ago)", ip, ok)
	}
	for _, s := range []string{"10.200.1.2", "10.200.1.3", "10.200.1.4", "10.200.1.5", "10.200.1.6"} {
		taken[netip.MustParseAddr(s)] = true
	}
	if ip, ok := pickIP(rng, gw, isTaken, released, now); !ok || ip.String() != "10.200.1.1" {
		t.Fatalf("range full but for a cooling address: got %v %v, want 10.200.1.1", ip, ok)
	}
	taken[netip.MustParseAddr("10.200.1.1")] = true
	if ip, ok := pickIP(rng, gw, isTaken, released, now); ok {
		t.Fatalf("full range: got %v", ip)
	}
}
