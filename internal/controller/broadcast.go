package controller

import (
	"encoding/json"
	"sync"
)

// broadcaster fans history entries and progress out to live followers
// (the dashboard's event stream). A follower too slow to keep up loses
// entries rather than slowing the controller. Safe for concurrent use.
type broadcaster struct {
	mu   sync.Mutex // guards subs
	subs map[chan []byte]struct{}
}

func newBroadcaster() *broadcaster { return &broadcaster{subs: map[chan []byte]struct{}{}} }

// StreamEvent is one line of the controller's event stream.
type StreamEvent struct {
	Kind string `json:"kind"`
	Data any    `json:"data"`
}

func (b *broadcaster) publish(kind string, v any) {
	msg, err := json.Marshal(StreamEvent{Kind: kind, Data: v})
	if err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.subs {
		select {
		case ch <- msg:
		default:
		}
	}
}

func (b *broadcaster) subscribe() (<-chan []byte, func()) {
	ch := make(chan []byte, 256)
	b.mu.Lock()
	b.subs[ch] = struct{}{}
	b.mu.Unlock()
	return ch, func() {
		b.mu.Lock()
		delete(b.subs, ch)
		b.mu.Unlock()
	}
}
