package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/edgehop/edgehop/internal/migration"
)

// RunRequest asks an agent to create and start a container.
type RunRequest struct {
	Name  string   `json:"name"`
	Image string   `json:"image"`
	IP    string   `json:"ip,omitempty"` // overlay address; allocated when empty
	Args  []string `json:"args,omitempty"`
	Env   []string `json:"env,omitempty"`
	// Group makes the container a member of an application that
	// migrates as one unit; After names the members it depends on (they
	// are restored before it serves).
	Group string   `json:"group,omitempty"`
	After []string `json:"after,omitempty"`
	// Pod makes the container a member of pod Pod: a group whose members
	// share one network namespace and address (the first member's), as
	// in Kubernetes. Group, if given, must be the same name.
	Pod string `json:"pod,omitempty"`
	// CapAdd are capabilities beyond the default set (runc's
	// DefaultCapabilities, which has neither CAP_MKNOD nor CAP_NET_RAW),
	// as "CAP_NET_RAW" or "NET_RAW"; an unknown one is refused. They stay
	// with the container when it migrates.
	CapAdd []string `json:"cap_add,omitempty"`
	// Memory (bytes), Pids and CPUs are the container's cgroup limits
	// (`edgehop run --memory 512m --pids 1024 --cpus 1.5`); zero takes
	// the agent's defaults (2 GiB, 4096 tasks, no CPU quota). They stay
	// with the container when it migrates.
	Memory int64   `json:"memory,omitempty"`
	Pids   int64   `json:"pids,omitempty"`
	CPUs   float64 `json:"cpus,omitempty"`
}

// Container describes a container on a node.
type Container struct {
	Name   string `json:"name"`
	Node   string `json:"node"`
	Image  string `json:"image"`
	IP     string `json:"ip"`
	MAC    string `json:"mac"`
	Status string `json:"status"` // running, stopped, created, migrating
	PID    int    `json:"pid,omitempty"`
	// MemoryBytes is the container's resident memory (what a migration
	// moves), from its memory cgroup.
	MemoryBytes int64     `json:"memory_bytes,omitempty"`
	Args        []string  `json:"args,omitempty"`
	Created     time.Time `json:"created"`
	// User is the image's User the service runs as ("" : root), Ports
	// the image's exposed ports.
	User  string   `json:"user,omitempty"`
	Ports []string `json:"ports,omitempty"`
	Group string   `json:"group,omitempty"`
	After []string `json:"after,omitempty"`
	// Pod is the pod the container belongs to (its group, whose members
	// share a network namespace); NetOf names the member whose namespace
	// and address it shares, empty for the pod's first, which holds them.
	Pod   string `json:"pod,omitempty"`
	NetOf string `json:"net_of,omitempty"`
	// CapAdd are the capabilities it has beyond the default set.
	CapAdd []string `json:"cap_add,omitempty"`
	// MemoryLimit (bytes), PidsLimit and CPUs are its cgroup limits
	// (zero: none).
	MemoryLimit int64   `json:"memory_limit,omitempty"`
	PidsLimit   int64   `json:"pids_limit,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
}

// Endpoint is where an overlay MAC lives; agents announce them to peers.
type Endpoint struct {
	Name string `json:"name"`
	IP   string `json:"ip"`
	MAC  string `json:"mac"`
	VTEP string `json:"vtep"`
	Node string `json:"node"`
}

// Info describes an agent.
type Info struct {
	Node    string `json:"node"`
	Role    string `json:"role"`
	VTEP    string `json:"vtep"`
	API     string `json:"api"`
	Version string `json:"version"`
}

// Error is the body of every non-2xx response.
type Error struct {
	Code    string `json:"code"` // not_found, conflict, invalid, forbidden, unavailable, internal
	Message string `json:"error"`
}

func (e *Error) Error() string { return e.Message }

// Sentinel errors matched with errors.Is against an *Error's code.
var (
	ErrNotFound    = errors.New("not found")
	ErrConflict    = errors.New("conflict")
	ErrInvalid     = errors.New("invalid request")
	ErrUnavailable = errors.New("unavailable")
	ErrForbidden   = errors.New("forbidden")
)

// Is maps codes to the sentinels.
func (e *Error) Is(target error) bool {
	switch e.Code {
	case "not_found":
		return target == ErrNotFound
	case "conflict":
		return target == ErrConflict
	case "invalid":
		return target == ErrInvalid
	case "unavailable":
		return target == ErrUnavailable
	case "forbidden":
		return target == ErrForbidden
	}
	return false
}

// Client talks to one agent. Safe for concurrent use.
type Client struct {
	http *http.Client
	base string
	addr string // for error messages
}

// NewUnixClient returns a client for the agent's local socket.
func NewUnixClient(sock string) *Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}
	return &Client{http: &http.Client{Transport: tr}, base: "http://agent", addr: sock}
}

// NewTCPClient returns a client for an agent's peer API at host:port.
func NewTCPClient(addr string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{}
	}
	scheme := "http"
	if t, ok := hc.Transport.(*http.Transport); ok && t.TLSClientConfig != nil {
		scheme = "https"
	}
	return &Client{http: hc, base: scheme + "://" + addr, addr: addr}
}

// Do sends a request with an optional JSON body and decodes a JSON answer
// into out (when non-nil).
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil && ctx.Err() != nil {
		// Reached, but no answer in time: not an unreachable agent.
		return fmt.Errorf("%w: no answer from the agent at %s in time (%v)", ErrUnavailable, c.addr, ctx.Err())
	}
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("%w: agent at %s unreachable (%v); is the testbed up ('edgehop testbed status')?", ErrUnavailable, c.addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errorOf(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if w, ok := out.(io.Writer); ok {
		_, err = io.Copy(w, resp.Body)
		return err
	}
	if err := DecodeAnswer(resp.Body, out); err != nil {
		return fmt.Errorf("%s %s from %s: %w", method, path, c.addr, err)
	}
	return nil
}

// MaxAnswer bounds a JSON answer Do reads: far above any agent's list of
// containers, jobs or endpoints, far below what would strain a node.
const MaxAnswer = 16 << 20

// ErrBadAnswer is wrapped by the errors about an answer that is not one
// JSON value of at most MaxAnswer bytes of the expected shape.
var ErrBadAnswer = errors.New("bad answer")

// DecodeAnswer decodes r, an agent's (or a peer's) answer, into out: one
// JSON value of at most MaxAnswer bytes and nothing after it but
// whitespace (ErrBadAnswer otherwise; a broken read is ErrUnavailable).
// Unknown fields are tolerated, not refused: two agents of different
// versions talk during a rolling upgrade, and a newer one's answer may
// carry a field this one does not know yet; every field it knows must
// have its type.
func DecodeAnswer(r io.Reader, out any) error {
	b, err := io.ReadAll(io.LimitReader(r, MaxAnswer+1))
	if err != nil {
		return fmt.Errorf("%w: reading the answer: %v", ErrUnavailable, err)
	}
	if len(b) > MaxAnswer {
		return fmt.Errorf("%w: more than %d bytes", ErrBadAnswer, MaxAnswer)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("%w: %v", ErrBadAnswer, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: data after the JSON value", ErrBadAnswer)
	}
	return nil
}

// errorOf reads a non-2xx answer's {"error","code"} body.
func errorOf(resp *http.Response) *Error {
	var e Error
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if json.Unmarshal(b, &e) != nil || e.Message == "" {
		e = Error{Code: "internal", Message: fmt.Sprintf("agent answered %s: %s", resp.Status, bytes.TrimSpace(b))}
	}
	return &e
}

// Info returns the agent's identity.
func (c *Client) Info(ctx context.Context) (Info, error) {
	var i Info
	return i, c.Do(ctx, http.MethodGet, "/v1/info", nil, &i)
}

// Run creates and starts a container.
func (c *Client) Run(ctx context.Context, r RunRequest) (Container, error) {
	var ct Container
	return ct, c.Do(ctx, http.MethodPost, "/v1/containers", r, &ct)
}

// List returns the agent's containers.
func (c *Client) List(ctx context.Context) ([]Container, error) {
	var cs []Container
	return cs, c.Do(ctx, http.MethodGet, "/v1/containers", nil, &cs)
}

// Get returns one container.
func (c *Client) Get(ctx context.Context, name string) (Container, error) {
	var ct Container
	return ct, c.Do(ctx, http.MethodGet, "/v1/containers/"+url.PathEscape(name), nil, &ct)
}

// Remove stops and deletes a container.
func (c *Client) Remove(ctx context.Context, name string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/containers/"+url.PathEscape(name), nil, nil)
}

// Logs copies a container's output to w.
func (c *Client) Logs(ctx context.Context, name string, w io.Writer) error {
	return c.Do(ctx, http.MethodGet, "/v1/containers/"+url.PathEscape(name)+"/logs", nil, w)
}

// Metrics copies the agent's Prometheus metrics (text exposition) to w.
func (c *Client) Metrics(ctx context.Context, w io.Writer) error {
	return c.Do(ctx, http.MethodGet, "/metrics", nil, w)
}

// Endpoints lists the overlay endpoints an agent hosts.
func (c *Client) Endpoints(ctx context.Context) ([]Endpoint, error) {
	var es []Endpoint
	return es, c.Do(ctx, http.MethodGet, "/v1/endpoints", nil, &es)
}

// Announce tells a peer where an endpoint lives now.
func (c *Client) Announce(ctx context.Context, e Endpoint) error {
	return c.Do(ctx, http.MethodPut, "/v1/fdb", e, nil)
}

// Withdraw tells a peer an endpoint is gone.
func (c *Client) Withdraw(ctx context.Context, e Endpoint) error {
	return c.Do(ctx, http.MethodDelete, "/v1/fdb", e, nil)
}

// MigrateRequest asks a node's agent to move one of its containers.
type MigrateRequest struct {
	To       string `json:"to"`
	Strategy string `json:"strategy"`
	Rounds   int    `json:"rounds,omitempty"` // pre-copy: most live rounds; 0 = agent default
	// Compression is off, zstd or auto ("" = auto); LinkBps the path's
	// rate that auto weighs compression against.
	Compression string `json:"compression,omitempty"`
	LinkBps     int64  `json:"link_bps,omitempty"`
	// MaxFrozenMs bounds the frozen window: past it the service is rolled
	// back on the source; 0 lets the agent choose from the state's size.
	MaxFrozenMs int64 `json:"max_frozen_ms,omitempty"`
}

// Migrate moves container name (on this client's agent) and waits for
// the outcome: StartMigration, then FollowJob. out receives the
// migration's result (also of a failed migration, whose error is then in
// it); progress, when not nil, receives every progress event.
func (c *Client) Migrate(ctx context.Context, name string, r MigrateRequest, out any, progress ...func(Progress)) error {
	j, err := c.StartMigration(ctx, name, r)
	if err != nil {
		return err
	}
	var fn func(Progress)
	if len(progress) > 0 {
		fn = progress[0]
	}
	j, err = c.FollowJob(ctx, j.ID, fn)
	if err != nil {
		return err
	}
	if out != nil && len(j.Result) > 0 {
		return json.Unmarshal(j.Result, out)
	}
	return nil
}

// StartMigration starts moving container name; the agent owns the job
// from then on (it goes on when the caller goes away).
func (c *Client) StartMigration(ctx context.Context, name string, r MigrateRequest) (Job, error) {
	var j Job
	return j, c.Do(ctx, http.MethodPost, "/v1/migrations", StartMigration{Container: name, MigrateRequest: r}, &j)
}

// StartGroupMigration starts moving every container of group on this
// client's agent as one unit: a job per member.
func (c *Client) StartGroupMigration(ctx context.Context, group string, r MigrateRequest) ([]Job, error) {
	var js []Job
	return js, c.Do(ctx, http.MethodPost, "/v1/groups/"+url.PathEscape(group)+"/migrations", r, &js)
}

// MigrateGroup starts moving group as StartGroupMigration does and
// follows every member's job to its end. It returns the jobs as they
// ended, one per member; a job that could not be followed to its end
// (it goes on on the agent) is an error naming it.
func (c *Client) MigrateGroup(ctx context.Context, group string, r MigrateRequest) ([]Job, error) {
	jobs, err := c.StartGroupMigration(ctx, group, r)
	if err != nil {
		return nil, err
	}
	out := make([]Job, len(jobs))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done, err := c.FollowJob(ctx, j.ID, nil)
			if err != nil {
				errs[i] = fmt.Errorf("migration %s of %s: %w (it goes on on the agent; see 'edgehop migrations')", j.ID, j.Container, err)
				return
			}
			out[i] = done
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// Job returns one migration job, running or ended.
func (c *Client) Job(ctx context.Context, id string) (Job, error) {
	var j Job
	return j, c.Do(ctx, http.MethodGet, "/v1/migrations/"+url.PathEscape(id), nil, &j)
}

// Jobs lists the node's running and past migration jobs.
func (c *Client) Jobs(ctx context.Context) ([]Job, error) {
	var js []Job
	return js, c.Do(ctx, http.MethodGet, "/v1/migrations", nil, &js)
}

// CancelJob cancels a job before its freeze; past it the agent refuses
// (ErrConflict).
func (c *Client) CancelJob(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/migrations/"+url.PathEscape(id), nil, nil)
}

// FollowJob streams job id's progress to fn until the job ends and returns
// it as it ended. When the stream breaks (the agent restarted) it asks
// again until the job is over or ctx ends: a restarted agent settles its
// jobs from its journal.
func (c *Client) FollowJob(ctx context.Context, id string, fn func(Progress)) (Job, error) {
	for {
		var done *Job
		err := c.stream(ctx, "/v1/migrations/"+url.PathEscape(id)+"/events", func(line []byte) error {
			var ev JobEvent
			if err := json.Unmarshal(line, &ev); err != nil {
				return fmt.Errorf("job %s: bad event: %w", id, err)
			}
			if ev.Progress != nil && fn != nil {
				fn(*ev.Progress)
			}
			if ev.Done != nil {
				done = ev.Done
			}
			return nil
		})
		if done != nil {
			return *done, nil
		}
		if err != nil && !errors.Is(err, ErrUnavailable) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return Job{}, err
		}
		select {
		case <-ctx.Done():
			return Job{}, fmt.Errorf("job %s: %w", id, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// stream GETs path and calls fn with every line of the answer.
func (c *Client) stream(ctx context.Context, path string, fn func([]byte) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: agent at %s unreachable (%v)", ErrUnavailable, c.addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errorOf(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		if err := fn(sc.Bytes()); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: stream from %s broke: %v", ErrUnavailable, c.addr, err)
	}
	return io.ErrUnexpectedEOF // the stream ends only after the job's end
}

// PeerPhase asks a peer agent what its journal says about migration id
// (peer API).
func (c *Client) PeerPhase(ctx context.Context, id string) (PeerPhase, error) {
	var p PeerPhase
	return p, c.Do(ctx, http.MethodGet, "/v1/peer/migrations/"+url.PathEscape(id), nil, &p)
}

// StartMigration asks a node's agent to move one of its containers: a job
// the agent owns from then on.
type StartMigration struct {
	Container string `json:"container"`
	MigrateRequest
}

// Progress is one progress event of a migration job.
type Progress struct {
	Time  time.Time `json:"time"`
	Phase string    `json:"phase"`          // the journaled phase (migration.Phase)
	Step  string    `json:"step,omitempty"` // the action under way
	// BytesSent counts what went on the wire so far; BytesTotal is the
	// estimated state to move (memory + writable layer), BytesLeft the
	// estimate of what remains; RateBps the recent send rate in bit/s.
	BytesSent  int64   `json:"bytes_sent"`
	BytesTotal int64   `json:"bytes_total,omitempty"`
	BytesLeft  int64   `json:"bytes_left"`
	RateBps    float64 `json:"rate_bps"`
	ETASeconds float64 `json:"eta_s,omitempty"`
}

// Job describes a migration job on the node that runs it.
type Job struct {
	ID        string `json:"id"`
	Role      string `json:"role"` // source or destination
	Container string `json:"container"`
	From      string `json:"from"`
	To        string `json:"to"`
	Strategy  string `json:"strategy"`
	Node      string `json:"node"`  // the node answering
	State     string `json:"state"` // queued, running, or the outcome: ok, aborted, rolled-back, lost, undecided
	// Reason says why a queued job waits (the node's or the
	// destination's cap of concurrent migrations, reserved scratch
	// space).
	Reason  string    `json:"reason,omitempty"`
	Started time.Time `json:"started"`
	// Admitted is when the job last got its slot of the node's
	// concurrent migrations (zero while queued), Ended when it ended.
	Admitted time.Time `json:"admitted,omitzero"`
	Ended    time.Time `json:"ended,omitzero"`
	Progress *Progress `json:"progress,omitempty"`
	// Result is the migration's result once it ended (source side).
	Result json.RawMessage `json:"result,omitempty"`
}

// MigrationResult decodes the result of an ended migration job. A job
// that ended without one yields a failed result naming its container and
// how the job ended; a result that does not decode is an error.
func (j Job) MigrationResult() (migration.Result, error) {
	var r migration.Result
	if len(j.Result) == 0 {
		r.ID, r.Container, r.From, r.To = j.ID, j.Container, j.From, j.To
		r.Outcome = migration.Outcome(j.State)
		r.Error = "the job ended " + j.State + " without a result"
		return r, nil
	}
	if err := json.Unmarshal(j.Result, &r); err != nil {
		return r, fmt.Errorf("result of migration job %s (%s): %w", j.ID, j.Container, err)
	}
	return r, nil
}

// JobEvent is one line of a job's event stream: progress, then the job as
// it ended.
type JobEvent struct {
	Progress *Progress `json:"progress,omitempty"`
	Done     *Job      `json:"done,omitempty"`
}

// PeerPhase is what an agent's journal says about a migration, for the
// other side of it.
type PeerPhase struct {
	ID    string `json:"id"`
	Role  string `json:"role"`
	Phase string `json:"phase"`
	// Running says, from a destination, that the migration's container
	// runs there now (a post-copy source asks it when its pages failed).
	Running bool `json:"running,omitempty"`
	// Holds says, from a source, that the service's tasks are there
	// again: its dump ended (no runc works on the container) and left
	// the container (a failed lazy dump, which CRIU resumes). A
	// destination whose restart cut its lazy pages off asks it.
	Holds bool `json:"holds,omitempty"`
}

// Heartbeat is what an agent reports to the controller every second.
type Heartbeat struct {
	Node       string   `json:"node"`
	Address    string   `json:"address,omitempty"`
	LinkBps    float64  `json:"link_bps,omitempty"`
	Containers []string `json:"containers"`
	// Groups are the groups (and pods) whose members all run here and
	// none migrates: a service that is a group is where its members are.
	Groups []string `json:"groups,omitempty"`
	// Migrating are the containers taking part in a migration job on the
	// node (as its source or destination), and the groups of such
	// containers: where they run is about to change, and they are not in
	// Containers or Groups.
	Migrating []string `json:"migrating,omitempty"`
	// MemoryBytes is the resident memory of each container in Containers
	// and each group in Groups (its members' sum), from their memory
	// cgroups: what migrating it would move.
	MemoryBytes map[string]int64 `json:"memory_bytes,omitempty"`
	// NeighbourRTTMs and UserRTTMs are the agent's latest measurements
	// (nil: none since the last heartbeat).
	NeighbourRTTMs map[string]float64 `json:"neighbour_rtt_ms,omitempty"`
	UserRTTMs      map[string]float64 `json:"user_rtt_ms,omitempty"`
}

// Target is something an agent is asked to measure its RTT to.
type Target struct {
	Name    string `json:"name"`
	Address string `json:"address"`
}

// HeartbeatReply tells an agent what to measure.
type HeartbeatReply struct {
	Users []Target `json:"users"`
	Nodes []Target `json:"nodes"`
}
