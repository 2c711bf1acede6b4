// Package fielderr is the error that names the field of a request, profile or config section
// that was wrong: the API answers it as 400 invalid-field, the CLI prints it with the field.
// It sits on the lowest floor so that every layer that validates input can return it.
package fielderr

import "fmt"

// Error names the field that is wrong and why.
type Error struct {
	Field   string
	Message string
}

func (e *Error) Error() string { return e.Field + ": " + e.Message }

// Errorf returns an *Error for field.
func Errorf(field, format string, args ...any) error {
	return &Error{Field: field, Message: fmt.Sprintf(format, args...)}
}
