package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
)

// TestAdmissionCapFIFO: at most max keys hold a slot; waiters get theirs
// in the order they came as slots are released.
func TestAdmissionCapFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ad := newAdmission(2)
		ctx := context.Background()
		var mu sync.Mutex
		var order []string
		running, most := 0, 0
		var wg sync.WaitGroup
		for i := range 5 {
			key := fmt.Sprint("m", i)
			wg.Go(func() {
				if err := ad.acquire(ctx, key); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				order = append(order, key)
				running++
				most = max(most, running)
				mu.Unlock()
				time.Sleep(time.Second)
				mu.Lock()
				running--
				mu.Unlock()
				ad.release(key)
			})
			synctest.Wait() // each one asks before the next
		}
		wg.Wait()
		if most != 2 {
			t.Errorf("%d ran at once, want 2", most)
		}
		if fmt.Sprint(order) != "[m0 m1 m2 m3 m4]" {
			t.Errorf("admitted in order %v, want first come first served", order)
		}
		if a, w := ad.state(); a != 0 || w != 0 || len(ad.slots) != 0 {
			t.Errorf("after every release: %d active, %d waiting, %d slots", a, w, len(ad.slots))
		}
	})
}

// TestAdmissionCancelWhileQueued: a waiter that gives up leaves the queue,
// and the slot goes to the next.
func TestAdmissionCancelWhileQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ad := newAdmission(1)
		if !ad.tryAcquire("a") {
			t.Fatal("a free slot was refused")
		}
		if ad.tryAcquire("b") {
			t.Fatal("a slot beyond the cap was given")
		}
		cctx, cancel := context.WithCancelCause(context.Background())
		errB := make(chan error, 1)
		go func() { errB <- ad.acquire(cctx, "b") }()
		gotC := make(chan error, 1)
		go func() { gotC <- ad.acquire(context.Background(), "c") }()
		synctest.Wait()
		if _, w := ad.state(); w != 2 {
			t.Fatalf("%d waiting, want 2", w)
		}
		cancel(errCancelled)
		if err := <-errB; !errors.Is(err, errCancelled) {
			t.Errorf("cancelled waiter: %v", err)
		}
		if _, w := ad.state(); w != 1 {
			t.Errorf("%d waiting after a cancel, want 1", w)
		}
		ad.release("a")
		if err := <-gotC; err != nil {
			t.Fatal(err)
		}
		ad.release("c")
		if a, w := ad.state(); a != 0 || w != 0 || len(ad.slots) != 0 {
			t.Errorf("leak: %d active, %d waiting, %d slots", a, w, len(ad.slots))
		}
	})
}

// TestAdmissionUnitSharesSlot: the members of a unit hold one slot
// together, so a group larger than the cap still runs at once; the slot
// is free once the last member released it.
func TestAdmissionUnitSharesSlot(t *testing.T) {
	ad := newAdmission(1)
	for range 3 {
		if err := ad.acquire(context.Background(), "unit"); err != nil {
			t.Fatal(err)
		}
	}
	if !ad.tryAcquire("unit") { // the destination's side of a member
		t.Error("a member was refused its unit's slot")
	}
	if ad.tryAcquire("other") {
		t.Error("another migration got in beside the unit")
	}
	for range 3 {
		ad.release("unit")
	}
	if ad.tryAcquire("other") {
		t.Error("the unit's slot was freed before its last member")
	}
	ad.release("unit")
	if !ad.tryAcquire("other") {
		t.Error("the unit's slot stayed taken")
	}
}

// TestAdmissionReservations: a reservation counts against the others
// until it is undone; members of one unit are told apart from others.
func TestAdmissionReservations(t *testing.T) {
	ad := newAdmission(2)
	var sawOthers, sawOwn reservation
	check := func(others, own reservation) error { sawOthers, sawOwn = others, own; return nil }
	if err := ad.reserve("a", reservation{unit: "u", scratch: 100, memory: 10}, check); err != nil {
		t.Fatal(err)
	}
	if err := ad.reserve("b", reservation{scratch: 50, memory: 5}, check); err != nil {
		t.Fatal(err)
	}
	if err := ad.reserve("c", reservation{unit: "u", scratch: 1}, check); err != nil {
		t.Fatal(err)
	}
	if sawOthers != (reservation{scratch: 50, memory: 5}) || sawOwn != (reservation{scratch: 100, memory: 10}) {
		t.Errorf("c saw others %+v, its unit %+v", sawOthers, sawOwn)
	}
	refused := errors.New("no")
	if err := ad.reserve("d", reservation{scratch: 1}, func(reservation, reservation) error { return refused }); err != refused {
		t.Errorf("a refused reservation: %v", err)
	}
	if n, total := ad.reservedTotal(); n != 3 || total.scratch != 151 || total.memory != 15 {
		t.Errorf("reserved %d: %+v", n, total)
	}
	for _, id := range []string{"a", "b", "c"} {
		ad.unreserve(id)
	}
	if n, _ := ad.reservedTotal(); n != 0 {
		t.Errorf("%d reservations left", n)
	}
}

// TestBusyIsRetryable: a busy refusal crosses as an abort with a retry
// time, which the source reads back; other refusals do not.
func TestBusyIsRetryable(t *testing.T) {
	err := error(&busyError{reason: "full"})
	if !errors.Is(fmt.Errorf("x: %w", err), errBusy) || errors.Is(ErrInvalid, errBusy) {
		t.Fatal("errBusy does not tell busy refusals apart")
	}
	for _, tc := range []struct {
		body string
		want time.Duration
	}{
		{`{"reason":"n1: full","retry_after_ms":1000}`, time.Second},
		{`{"reason":"n1: no"}`, 0},
		{`{"reason":"n1: full","retry_after_ms":3600000}`, time.Minute},
	} {
		perr := peerMessage{typ: migration.MsgAbort, body: []byte(tc.body)}.from("n1", migration.MsgPrepared, nil)
		var pa *peerAbort
		if !errors.As(perr, &pa) || pa.retryAfter != tc.want {
			t.Errorf("%s: %v (%+v), want retry after %v", tc.body, perr, pa, tc.want)
		}
	}
}

// TestQueuedJob: a queued job says so, with its reason, until admitted.
func TestQueuedJob(t *testing.T) {
	j := newJob("id", migration.RoleSource, "c", "n0", "n1", migration.StopAndCopy, nil)
	j.setQueued("waiting for a slot")
	s, _, _ := j.snapshot("n0")
	if s.State != JobQueued || s.Reason != "waiting for a slot" || !s.Admitted.IsZero() {
		t.Errorf("queued: %+v", s)
	}
	j.setQueued("")
	s, _, _ = j.snapshot("n0")
	if s.State != "running" || s.Reason != "" || s.Admitted.IsZero() {
		t.Errorf("admitted: %+v", s)
	}
	j.end(migration.OutcomeOK, nil)
	s, done, _ := j.snapshot("n0")
	if !done || s.State != "ok" || s.Ended.IsZero() {
		t.Errorf("ended: %+v", s)
	}
}

// TestLimitsFor: a run request's limits, with the defaults for those it
// leaves out, checked.
func TestLimitsFor(t *testing.T) {
	for _, tc := range []struct {
		r               api.RunRequest
		mem, pids, cpuM int64
		bad             bool
	}{
		{r: api.RunRequest{}, mem: DefaultMemoryLimit, pids: DefaultPidsLimit},
		{r: api.RunRequest{Memory: 64 << 20, Pids: 100, CPUs: 1.5}, mem: 64 << 20, pids: 100, cpuM: 1500},
		{r: api.RunRequest{CPUs: 0.001}, mem: DefaultMemoryLimit, pids: DefaultPidsLimit, cpuM: 10},
		{r: api.RunRequest{Memory: 1024}, bad: true},
		{r: api.RunRequest{Pids: 2}, bad: true},
		{r: api.RunRequest{CPUs: -1}, bad: true},
		{r: api.RunRequest{CPUs: 1e9}, bad: true},
	} {
		mem, pids, cpuM, err := limitsFor(tc.r)
		if (err != nil) != tc.bad || (!tc.bad && (mem != tc.mem || pids != tc.pids || cpuM != tc.cpuM)) {
			t.Errorf("limitsFor(%+v) = %d, %d, %d, %v", tc.r, mem, pids, cpuM, err)
		}
	}
	if err := checkLimits(migration.Process{}); err != nil {
		t.Errorf("no limits (a service from before them): %v", err)
	}
}

// TestScratchReservedAcrossMigrations: checkScratchSpace counts what
// other incoming migrations reserved (a busy refusal, for the source to
// wait), forgets it once they end, and still refuses outright what could
// never fit.
func TestScratchReservedAcrossMigrations(t *testing.T) {
	a := &Agent{cfg: Config{StateDir: t.TempDir(), Node: "n1"}, admit: newAdmission(2)}
	if err := os.MkdirAll(a.scratchDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	st, serr := linux.StatFileSystem(a.scratchDir())
	if serr != nil {
		t.Fatal(serr)
	}
	free := int64(st.Avail)
	prep := func(id string, mem int64) migration.Prepare {
		return migration.Prepare{ID: id, Name: id, Strategy: migration.StopAndCopy, MemoryBytes: mem}
	}
	if err := a.checkScratchSpace(prep("big", free*3/4)); err != nil {
		t.Fatalf("the first migration: %v", err)
	}
	err := a.checkScratchSpace(prep("second", free/2))
	if !errors.Is(err, errBusy) {
		t.Fatalf("a second one beyond what is left: %v, want busy", err)
	}
	if err := a.checkScratchSpace(prep("never", 2*free)); err == nil || errors.Is(err, errBusy) || !errors.Is(err, ErrInvalid) {
		t.Errorf("one that cannot fit at all: %v, want refused for good", err)
	}
	a.admit.unreserve("big")
	if err := a.checkScratchSpace(prep("second", free/2)); err != nil {
		t.Errorf("once the first ended: %v", err)
	}
	a.admit.unreserve("second")
	if n, _ := a.admit.reservedTotal(); n != 0 {
		t.Errorf("%d reservations left", n)
	}
}
