// Package jsonbody decodes JSON request bodies strictly: one value, no unknown fields, and an
// error that names the field that was wrong (a *fielderr.Error, answered 400 invalid-field).
package jsonbody

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"

	"github.com/openclaw/cloudworkers/internal/fielderr"
)

// Decode decodes r into v; an empty body is refused. A body over the server's limit keeps its
// *http.MaxBytesError (413).
func Decode(r io.Reader, v any) error { return decode(r, v, false) }

// DecodeOptional is Decode for a body that may be left out: an empty body leaves v as it is.
func DecodeOptional(r io.Reader, v any) error { return decode(r, v, true) }

func decode(r io.Reader, v any, optional bool) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return describe(err, v, optional)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return fielderr.Errorf("body", "has data after the JSON object")
	}
	return nil
}

func describe(err error, v any, optional bool) error {
	var mbe *http.MaxBytesError
	var ute *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &mbe):
		return err
	case errors.Is(err, io.EOF):
		if optional {
			return nil
		}
		return fielderr.Errorf("body", "is empty (expected a JSON object)")
	case errors.As(err, &ute):
		if ute.Field == "" {
			return fielderr.Errorf("body", "must be a JSON %s, got %s", kind(reflect.TypeOf(v)), ute.Value)
		}
		return fielderr.Errorf(ute.Field, "must be %s, got %s", kind(ute.Type), ute.Value)
	case errors.As(err, &se):
		return fielderr.Errorf("body", "invalid JSON at byte %d: %v", se.Offset, se)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fielderr.Errorf("body", "invalid JSON: it ends early")
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return fielderr.Errorf(strings.Trim(f, `"`), "unknown field")
	}
	return fielderr.Errorf("body", "invalid JSON: %v", err)
}

// kind names a Go type as JSON sees it.
func kind(t reflect.Type) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "value"
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "object"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	}
	return fmt.Sprint(t)
}
