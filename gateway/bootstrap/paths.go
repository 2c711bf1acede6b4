package bootstrap

import (
	"path"

	"github.com/openclaw/cloudworkers/internal/untrusted"
)

// WorkerPIDPath is the pidfile of the worker of environment envID on a box whose HOME is home:
// the worker's pid while it runs (the demo and teardown end a worker by it).
func WorkerPIDPath(home, envID string) string { return path.Join(home, StateDir(envID), "worker.pid") }

// liveWorkerPID is a box command that succeeds, with the pid in $p, only while the worker of
// environment envID on a box whose HOME is home runs: the pidfile names a process whose arguments
// are the worker's (`<bundle> worker --descriptor <state dir>/launch.json …`). A worker that ended
// leaves its pid behind, and on a busy box that pid soon belongs to another process: it is neither
// signalled nor taken for the worker. The arguments are read from /proc and compared one by one
// (a process that only mentions them, this check's own shell included, is not the worker); where
// there is no /proc (macOS), ps's joined arguments must contain them.
func liveWorkerPID(home, envID string) string {
	return `d=` + untrusted.Quote(path.Join(home, StateDir(envID))) + `
p=$(cat "$d/worker.pid" 2>/dev/null) && case $p in ''|*[!0-9]*) false;; esac &&
if [ -d /proc/self ]; then
	[ "$(tr '\0' '\n' 2>/dev/null <"/proc/$p/cmdline" | sed -n '2,4p')" = "worker
--descriptor
$d/launch.json" ]
else
	case "$(ps -ww -o args= -p "$p" 2>/dev/null) " in *" worker --descriptor $d/launch.json "*) true;; *) false;; esac
fi`
}
