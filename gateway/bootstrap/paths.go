package bootstrap

import "path"

// WorkerPIDPath is the pidfile of the worker of environment envID on a box whose HOME is home:
// the worker's pid while it runs (the demo and teardown end a worker by it).
func WorkerPIDPath(home, envID string) string { return path.Join(home, StateDir(envID), "worker.pid") }

// liveWorkerPID is a box command that succeeds, with the pid in $p, only while the worker of
// environment envID on a box whose HOME is home runs: the pidfile names a process whose command
// line is that worker's (`… worker --descriptor <state dir>/launch.json …`). A worker that ended
// leaves its pid behind, and on a busy box that pid is soon another process's: it is neither
// signalled nor taken for the worker. /proc is read where there is one, else ps (macOS).
func liveWorkerPID(home, envID string) string {
	state := path.Join(home, StateDir(envID))
	return `p=$(cat ` + Quote(path.Join(state, "worker.pid")) + ` 2>/dev/null) && case $p in ''|*[!0-9]*) false;; esac &&
if [ -d /proc/self ]; then a=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null); else a=$(ps -o args= -p "$p" 2>/dev/null); fi &&
case "$a " in *` + Quote(" worker --descriptor "+path.Join(state, "launch.json")+" ") + `*) true;; *) false;; esac`
}
