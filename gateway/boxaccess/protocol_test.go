package boxaccess

import (
	"strings"
	"testing"
)

func TestStartRefusesBadInput(t *testing.T) {
	for _, c := range []struct {
		name string
		st   Start
		want string
	}{
		{"nul in an argument", Start{Command: []string{"echo", "a\x00b"}}, "command[1]: contains a NUL byte"},
		{"empty command name", Start{Command: []string{"", "x"}}, "command[0]: is empty"},
		{"too many arguments", Start{Command: make([]string, MaxArgs+1)}, "at most 1024 arguments"},
		{"too long", Start{Command: []string{strings.Repeat("x", MaxCommandBytes)}}, "at most 65536 bytes"},
		{"term without tty", Start{Term: "xterm"}, "only with tty"},
		{"shell metacharacters in term", Start{TTY: true, Term: "xterm;id", Rows: 24, Cols: 80}, "term: must be"},
		{"empty term", Start{TTY: true, Rows: 24, Cols: 80}, "term: must be"},
		{"zero window", Start{TTY: true, Term: "xterm"}, "rows and cols"},
		{"huge window", Start{TTY: true, Term: "xterm", Rows: 24, Cols: MaxWindow + 1}, "rows and cols"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.st.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
	for _, ok := range []Start{{}, {Command: []string{"uname", "-a"}}, {TTY: true, Term: "xterm-256color", Rows: 50, Cols: 200}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%+v refused: %v", ok, err)
		}
	}
}

func TestShellCommandQuotesEveryArgument(t *testing.T) {
	got := shellCommand([]string{"printf", "%s", "it's", "$(id)", "a b"})
	want := `exec 'printf' '%s' 'it'\''s' '$(id)' 'a b'`
	if got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestConfigNamesTheBadField(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{MaxFrameBytes: 100}, "boxAccess.maxFrameBytes"},
		{Config{OutputBytesPerSecond: 1000}, "boxAccess.outputBytesPerSecond"},
		{Config{SessionsPerEnvironment: -1}, "boxAccess.sessionsPerEnvironment"},
		{Config{LogTailBytes: -1}, "boxAccess.logTailBytes"},
		{Config{MaxExtend: -1}, "boxAccess.maxExtend"},
		{Config{StdinStall: -1}, "boxAccess.stdinStall"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %s", c.cfg, err, c.want)
		}
	}
	var d Config
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	d.SetDefaults()
	if d.MaxFrameBytes != DefaultMaxFrameBytes || d.SessionsPerEnvironment != DefaultSessionsPerEnvironment || d.MaxExtend.D() != DefaultMaxExtend {
		t.Fatalf("defaults: %+v", d)
	}
}
