package shutdown

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
)

func TestStackClosesInReverseOrderAndReportsEachFailure(t *testing.T) {
	var s Stack
	var order []string
	errB := errors.New("b failed")
	push := func(name string, err error) {
		s.Push(name, func(context.Context) error {
			order = append(order, name)
			return err
		})
	}
	push("a", nil)
	push("b", errB)
	push("c", nil)
	err := s.Close(context.Background())
	if want := []string{"c", "b", "a"}; !slices.Equal(order, want) {
		t.Fatalf("closed %v, want %v", order, want)
	}
	if !errors.Is(err, errB) || err.Error() != "close b: b failed" {
		t.Fatalf("Close = %v, want the failure of b", err)
	}
	order = nil
	if err := s.Close(context.Background()); err != nil || len(order) != 0 {
		t.Fatalf("second Close = %v and closed %v, want nothing closed again", err, order)
	}
}

func TestWaitGivesUpAtTheDeadline(t *testing.T) {
	var wg sync.WaitGroup
	wg.Add(1)
	defer wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Wait(ctx, &wg, "workers")
	if !errors.Is(err, context.Canceled) || err.Error() != "workers still running: context canceled" {
		t.Fatalf("Wait = %v, want the deadline naming what still runs", err)
	}
}

func TestWaitReturnsOnceDone(t *testing.T) {
	var wg sync.WaitGroup
	wg.Add(1)
	go wg.Done()
	if err := Wait(context.Background(), &wg, "workers"); err != nil {
		t.Fatal(err)
	}
}
