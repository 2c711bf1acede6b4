package bootstrap

import "path"

// WorkerPIDPath is the pidfile of the worker of environment envID on a box whose HOME is home:
// the worker's pid while it runs (the demo and teardown end a worker by it).
func WorkerPIDPath(home, envID string) string { return path.Join(home, StateDir(envID), "worker.pid") }
