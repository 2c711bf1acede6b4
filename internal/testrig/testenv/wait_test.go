package testenv

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestContextEndsAfterItsBound(t *testing.T) {
	ctx := Context(t, time.Nanosecond)
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", ctx.Err())
	}
}

func TestContextEndsWithTheTest(t *testing.T) {
	var ctx context.Context
	t.Run("inner", func(t *testing.T) { ctx = Context(t, time.Hour) })
	if ctx.Err() == nil {
		t.Fatal("context outlived its test")
	}
}

func TestEventuallyReturnsOnceCondHolds(t *testing.T) {
	var n atomic.Int32
	Eventually(t, "third poll", func() bool { return n.Add(1) >= 3 })
	if n.Load() != 3 {
		t.Fatalf("polled %d times, want 3", n.Load())
	}
}
