package console

import "testing"

func TestReadableToolArguments(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"command":"make test \u0026\u0026 echo \u003cok\u003e"}`, `{"command":"make test && echo <ok>"}`},
		{`{"n": 12345678901234567890}`, `{"n":12345678901234567890}`},
		{`not json`, `not json`},
	} {
		if got := Readable([]byte(c.in)); got != c.want {
			t.Errorf("Readable(%s) = %s, want %s", c.in, got, c.want)
		}
	}
}
