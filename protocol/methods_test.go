package protocol

import (
	"slices"
	"testing"
)

// TestWorkerMethodsCannotBeWidened: the allowlist is read through accessors; what WorkerMethods
// returns is a copy, so a caller that changes it grants nothing.
func TestWorkerMethodsCannotBeWidened(t *testing.T) {
	list := WorkerMethods()
	if !slices.IsSorted(list) || !slices.Contains(list, MethodTranscriptCommit) || len(list) != len(workerMethods) {
		t.Fatalf("WorkerMethods() = %v", list)
	}
	for _, m := range list {
		if !IsWorkerMethod(m) {
			t.Errorf("IsWorkerMethod(%s) = false", m)
		}
	}
	list[0] = MethodShutdown
	if IsWorkerMethod(MethodShutdown) || slices.Contains(WorkerMethods(), MethodShutdown) {
		t.Fatal("changing the returned list granted a gateway method to workers")
	}
	if IsWorkerMethod("worker.sessions.kill") {
		t.Fatal("a method outside the allowlist is allowed")
	}
}
