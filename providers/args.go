package providers

import "regexp"

// Values that reach a lease CLI's argv (machine classes, lease ids, slugs, environment and gateway
// ids, labels) come from users, OCC, agents, MCP clients and the CLIs themselves. Each kind has one
// checker here, used on every path that accepts it and once more where the argv is built, so a
// value can neither add an argument, nor read as an option (a leading '-'), nor carry anything a
// shell would interpret when an operator's template runs one.
var (
	// machineClassPattern is OCC's form of a machine class.
	machineClassPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	// argPattern is the form of every other value substituted into a lease CLI's argv.
	argPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$`)
)

// MaxArgLen bounds a value substituted into a lease CLI's argv.
const MaxArgLen = 128

// CheckMachineClass refuses a machine class that is not 1-64 letters, digits, '.', '_' or '-'
// starting with a letter or digit; the error is a *FieldError naming "machineClass".
func CheckMachineClass(class string) error {
	if !machineClassPattern.MatchString(class) {
		return Fieldf("machineClass", "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit, got %.40q", class)
	}
	return nil
}

// CheckArg refuses a value for a lease CLI's argv (a lease id, slug, label value, environment or
// gateway id) that is not 1-128 letters, digits, '.', '_', ':', '@' or '-' starting with a letter
// or digit; the error is a *FieldError naming field.
func CheckArg(field, v string) error {
	if !argPattern.MatchString(v) {
		return Fieldf(field, "must be 1-%d letters, digits, '.', '_', ':', '@' or '-', starting with a letter or digit, got %.40q", MaxArgLen, v)
	}
	return nil
}

// ValidArg reports whether v passes CheckArg.
func ValidArg(v string) bool { return argPattern.MatchString(v) }
