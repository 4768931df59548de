package runc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"
)

// IO says where a container's output goes. The container never sees these
// writers: it gets the write ends of pipes, and the Runtime copies the read
// ends into Stdout and Stderr until the container's processes have all
// closed them (the container exited, was checkpointed, or was deleted).
// Standard input is an empty pipe (reads return end of file).
//
// Writes to Stdout and Stderr of one container are serialized, so the same
// writer may be given for both; a writer is never written to after the
// call that ends its container's streams (Delete, a Checkpoint that stops
// the container, Close) has returned.
type IO struct {
	Stdout io.Writer // nil discards
	Stderr io.Writer // nil discards
}

// childStdio are the pipe ends handed to runc, which passes them to the
// container; the parent closes its copies once runc has exited.
type childStdio struct {
	stdin, stdout, stderr *os.File
}

func (c childStdio) close() {
	for _, f := range []*os.File{c.stdin, c.stdout, c.stderr} {
		if f != nil {
			f.Close()
		}
	}
}

// streams copies one container's output pipes into its IO writers. Its two
// goroutines are owned by the streams value: wait (or close) ends them.
type streams struct {
	readers []*os.File
	wg      sync.WaitGroup
	done    chan struct{} // closed when every copier has returned
	mu      sync.Mutex    // serializes writes to the IO writers
}

// newStreams creates the stdin, stdout and stderr pipes and starts copying.
func newStreams(o IO, log *slog.Logger, id string) (childStdio, *streams, error) {
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return childStdio{}, nil, err
	}
	// Nothing is ever written to stdin: closing the write end gives EOF.
	inW.Close()
	files = append(files, inR)
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll()
		return childStdio{}, nil, err
	}
	files = append(files, outR, outW)
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll()
		return childStdio{}, nil, err
	}
	s := &streams{readers: []*os.File{outR, errR}, done: make(chan struct{})}
	s.start(outR, o.Stdout, log.With("container", id, "stream", "stdout"))
	s.start(errR, o.Stderr, log.With("container", id, "stream", "stderr"))
	go func() {
		s.wg.Wait()
		close(s.done)
	}()
	return childStdio{stdin: inR, stdout: outW, stderr: errW}, s, nil
}

func (s *streams) start(r *os.File, w io.Writer, log *slog.Logger) {
	if w == nil {
		w = io.Discard
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer r.Close()
		buf := make([]byte, 32*1024)
		writeFailed := false
		for {
			n, err := r.Read(buf)
			if n > 0 && !writeFailed {
				s.mu.Lock()
				_, werr := w.Write(buf[:n])
				s.mu.Unlock()
				if werr != nil {
					// Keep draining so the container never blocks on a
					// full pipe; its output is lost from here on.
					writeFailed = true
					log.Warn("container output writer failed; discarding output", "err", werr)
				}
			}
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed) {
					log.Warn("read container output", "err", err)
				}
				return
			}
		}
	}()
}

// wait returns once both copiers have seen end of file. When ctx ends (or
// limit passes) first, it closes the pipes, which ends the copiers, and
// still waits for them; the output not yet copied is lost.
func (s *streams) wait(ctx context.Context, limit time.Duration) {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-s.done:
		return
	case <-ctx.Done():
	case <-t.C:
	}
	s.close()
}

// close stops copying now and waits for the copiers to return.
func (s *streams) close() {
	for _, r := range s.readers {
		// Closing an os.Pipe end unblocks a pending Read with ErrClosed.
		r.Close()
	}
	<-s.done
}
