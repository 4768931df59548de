package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/migration"
)

// A destination waiting for the freeze gives up a source that says
// nothing for Config.SourceSilenceMs (its agent stopped, the connection
// still open), and only then: a source that keeps talking is waited for
// however long it takes to freeze.
func TestReceiveRoundsSourceSilent(t *testing.T) {
	a := &Agent{cfg: Config{SourceSilenceMs: 300}}
	live := func(context.Context, migration.LiveLayer) error { return nil }
	ctx := context.Background()

	s, r := connPair(t)
	done := make(chan error, 1)
	go func() {
		_, err := a.receiveRounds(ctx, r, nil, "", live)
		done <- err
	}()
	for range 5 { // 1 s in all, each gap 200 ms
		time.Sleep(200 * time.Millisecond)
		if err := s.WriteMsg(ctx, migration.MsgLiveLayer, migration.LiveLayer{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.WriteMsg(ctx, migration.MsgFrozen, migration.FreezeNotice{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("a source talking every 200 ms for 1 s, then freezing: %v", err)
	}

	_, r = connPair(t)
	go func() {
		_, err := a.receiveRounds(ctx, r, nil, "", live)
		done <- err
	}()
	start := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, errSourceSilent) {
			t.Fatalf("silent source: %v, want %v", err, errSourceSilent)
		}
		if d := time.Since(start); d < 300*time.Millisecond || d > 3*time.Second {
			t.Errorf("gave up after %s, want about 300ms", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a silent source is waited for forever")
	}
}
