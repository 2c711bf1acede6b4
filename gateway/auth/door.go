package auth

import "net/http"

// Door wraps the handler of a door that checks its own bearer token (/mcp, /occ/v1): each of its
// 401 answers is recorded in refusals under door's name.
func Door(door string, refusals *Refusals, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		if sw.status == http.StatusUnauthorized {
			why := "no credentials"
			if r.Header.Get("Authorization") != "" {
				why = "wrong bearer token"
				if _, ok := Bearer(r); !ok {
					why = "Authorization header without a bearer token"
				}
			}
			refusals.Refuse(r, door, why)
		}
	})
}

// statusWriter notes the status of an answer; Flush and Unwrap keep streaming and
// http.ResponseController working through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		if w.status == 0 {
			w.status = http.StatusOK
		}
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
