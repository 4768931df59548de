package agent

// notifier wakes the goroutines waiting for a change of some state that
// its owner guards with its own lock: wait and notify are called with
// that lock held. The zero value is ready.
type notifier struct{ ch chan struct{} }

// wait returns a channel closed at the next notify.
func (n *notifier) wait() <-chan struct{} {
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

// notify wakes every waiter.
func (n *notifier) notify() {
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}
