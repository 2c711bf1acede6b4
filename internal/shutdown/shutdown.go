// Package shutdown closes a process's long-lived components in reverse start order under one
// deadline.
package shutdown

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Wait waits for wg, or until ctx ends, when it returns an error naming what is still running.
func Wait(ctx context.Context, wg *sync.WaitGroup, what string) error {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s still running: %w", what, context.Cause(ctx))
	}
}

// Stack is a process's long-lived components in the order they started. The zero value is empty.
type Stack struct {
	mu      sync.Mutex
	closers []closer
}

type closer struct {
	name  string
	close func(context.Context) error
}

// Push adds a component that has just started; Close closes it before every component pushed
// earlier.
func (s *Stack) Push(name string, close func(context.Context) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closers = append(s.closers, closer{name, close})
}

// Close closes every component in reverse start order, each once, under ctx: one that fails or
// does not finish in time is reported and the ones started before it are still closed. Components
// pushed after Close are closed by the next Close.
func (s *Stack) Close(ctx context.Context) error {
	s.mu.Lock()
	cs := s.closers
	s.closers = nil
	s.mu.Unlock()
	var errs []error
	for i := len(cs) - 1; i >= 0; i-- {
		if err := cs[i].close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", cs[i].name, err))
		}
	}
	return errors.Join(errs...)
}
