package testenv

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Alive reports whether pid is a live process; a zombie (a process that ended and was not reaped
// yet, as the processes a test checks on are often not its children) counts as gone.
func Alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}
