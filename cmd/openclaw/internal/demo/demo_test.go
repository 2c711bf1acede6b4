package demo

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"
)

// TestBuiltinScriptIsTheExample: `openclaw demo` without --script runs the same turns as
// `make demo`, which passes examples/demo/script.json.
func TestBuiltinScriptIsTheExample(t *testing.T) {
	b, err := os.ReadFile("../../../../examples/demo/script.json")
	if err != nil {
		t.Fatal(err)
	}
	var example, builtin any
	if err := json.Unmarshal(b, &example); err != nil {
		t.Fatalf("examples/demo/script.json: %v", err)
	}
	if err := json.Unmarshal([]byte(builtinScript), &builtin); err != nil {
		t.Fatalf("built-in script: %v", err)
	}
	if !reflect.DeepEqual(example, builtin) {
		t.Fatalf("the built-in script differs from examples/demo/script.json:\nbuilt-in: %s\nexample:  %s", builtinScript, b)
	}
}
