package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/migration"
)

// job is one migration this node takes part in. The agent owns it: it
// runs on the agent's context, not on the request that started it. Safe
// for concurrent use.
type job struct {
	id        string
	role      migration.Role
	container string
	from, to  string
	strategy  migration.Strategy
	started   time.Time

	mu        sync.Mutex // guards everything below
	frozen    bool       // past the freeze: cancelling is refused
	cancelled bool
	cancel    context.CancelCauseFunc // cancels the steps before the freeze
	progress  api.Progress
	outcome   migration.Outcome // "" while running
	result    *migration.Result
	// queued says why the job waits for a slot (admission); "" once it
	// has one. admitted is when it last got one, ended when it ended.
	queued   string
	admitted time.Time
	ended    time.Time
	changed  chan struct{} // closed and replaced at every change
}

// JobQueued is the state of a job waiting for a slot of its node's (or
// its destination's) concurrent migrations.
const JobQueued = "queued"

// setQueued marks the job waiting for why; "" marks it admitted.
func (j *job) setQueued(why string) {
	j.mu.Lock()
	j.queued = why
	if why == "" {
		j.admitted = time.Now().UTC()
	}
	j.notifyLocked()
	j.mu.Unlock()
}

func newJob(id string, role migration.Role, container, from, to string, s migration.Strategy, cancel context.CancelCauseFunc) *job {
	return &job{id: id, role: role, container: container, from: from, to: to, strategy: s, started: time.Now().UTC(),
		cancel: cancel, changed: make(chan struct{}), progress: api.Progress{Time: time.Now().UTC(), Phase: string(migration.Preparing)}}
}

// ErrPastFreeze refuses to cancel a migration whose service is frozen.
var ErrPastFreeze = errors.New("the service is frozen: the migration can no longer be cancelled, only completed or rolled back")

// requestCancel cancels the job if it has not frozen the service yet.
func (j *job) requestCancel() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.outcome != "" {
		return fmt.Errorf("%w: migration %s already ended (%s)", ErrConflict, j.id, j.outcome)
	}
	if j.frozen {
		return fmt.Errorf("%w: %w", ErrConflict, ErrPastFreeze)
	}
	j.cancelled = true
	if j.cancel != nil {
		j.cancel(errCancelled)
	}
	return nil
}

var errCancelled = errors.New("cancelled by the operator")

// enterFreeze marks the job frozen unless it was cancelled: a cancel
// either happens before the freeze or is refused.
func (j *job) enterFreeze() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.cancelled {
		return false
	}
	j.frozen = true
	return true
}

// update changes the progress under the lock and wakes followers.
func (j *job) update(fn func(p *api.Progress)) {
	j.mu.Lock()
	fn(&j.progress)
	j.progress.Time = time.Now().UTC()
	j.notifyLocked()
	j.mu.Unlock()
}

func (j *job) notifyLocked() {
	close(j.changed)
	j.changed = make(chan struct{})
}

// end records the outcome and result and wakes followers.
func (j *job) end(o migration.Outcome, res *migration.Result) {
	j.mu.Lock()
	j.outcome, j.result = o, res
	j.queued, j.ended = "", time.Now().UTC()
	j.notifyLocked()
	j.mu.Unlock()
}

// snapshot describes the job for the API; done is non-nil once it ended,
// wait is closed at the next change.
func (j *job) snapshot(node string) (api.Job, bool, <-chan struct{}) {
	j.mu.Lock()
	defer j.mu.Unlock()
	p := j.progress
	out := api.Job{ID: j.id, Role: string(j.role), Container: j.container, From: j.from, To: j.to,
		Strategy: string(j.strategy), Node: node, State: "running", Started: j.started, Progress: &p,
		Admitted: j.admitted, Ended: j.ended}
	if j.queued != "" {
		out.State, out.Reason = JobQueued, j.queued
	}
	if j.outcome != "" {
		out.State = string(j.outcome)
		if j.result != nil {
			out.Result, _ = json.Marshal(j.result)
		}
	}
	return out, j.outcome != "", j.changed
}

// jobs is the node's registry of migration jobs. Safe for concurrent use.
type jobs struct {
	mu   sync.Mutex // guards byID
	byID map[string]*job
}

func (js *jobs) add(j *job) {
	js.mu.Lock()
	defer js.mu.Unlock()
	if js.byID == nil {
		js.byID = map[string]*job{}
	}
	js.byID[j.id] = j
	// Ended jobs stay for followers a while; the history keeps the rest.
	if len(js.byID) > 256 {
		var ended []*job
		for _, o := range js.byID {
			o.mu.Lock()
			if o.outcome != "" {
				ended = append(ended, o)
			}
			o.mu.Unlock()
		}
		sort.Slice(ended, func(a, b int) bool { return ended[a].started.Before(ended[b].started) })
		for i := 0; i < len(ended)-128; i++ {
			delete(js.byID, ended[i].id)
		}
	}
}

func (js *jobs) get(id string) *job {
	js.mu.Lock()
	defer js.mu.Unlock()
	return js.byID[id]
}

func (js *jobs) all() []*job {
	js.mu.Lock()
	defer js.mu.Unlock()
	out := make([]*job, 0, len(js.byID))
	for _, j := range js.byID {
		out = append(out, j)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].started.Before(out[b].started) })
	return out
}

// running counts jobs that have not ended.
func (js *jobs) running() int {
	n := 0
	for _, j := range js.all() {
		j.mu.Lock()
		if j.outcome == "" {
			n++
		}
		j.mu.Unlock()
	}
	return n
}
