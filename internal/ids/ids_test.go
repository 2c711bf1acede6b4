package ids

import (
	"regexp"
	"testing"
)

// Ids have the asked length and prefix, and do not repeat.
func TestNewIsPrefixedHexAndUnique(t *testing.T) {
	re := regexp.MustCompile(`^ses_[0-9a-f]{24}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := New("ses_", 12)
		if !re.MatchString(id) || seen[id] {
			t.Fatalf("id %q: malformed or repeated", id)
		}
		seen[id] = true
	}
	if len(Hex(16)) != 32 {
		t.Fatal("Hex(16) is not 32 digits")
	}
}
