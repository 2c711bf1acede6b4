package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"github.com/openclaw/cloudworkers/gateway/boxaccess"
	"github.com/openclaw/cloudworkers/gateway/envs"
)

// ExtendEnvironment renews an environment's lease for ttl (a Go duration) from now.
func (c *Client) ExtendEnvironment(ctx context.Context, id, ttl string) (envs.Environment, error) {
	return doAs[envs.Environment](ctx, c, http.MethodPost, v1("environments", id, "extend"), boxaccess.ExtendRequest{TTL: ttl})
}

// EnvironmentLogs opens the end of the worker's log on an environment's box: the last tail lines,
// then with follow what is appended until ctx ends or the environment does. The caller closes it.
func (c *Client) EnvironmentLogs(ctx context.Context, id string, tail int, follow bool) (io.ReadCloser, error) {
	u := c.BaseURL + v1("environments", id, "logs") + "?tail=" + strconv.Itoa(tail) + "&follow=" + strconv.FormatBool(follow)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	hc := *c.HTTP
	hc.Timeout = 0 // a follow lasts as long as ctx
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("gateway at %s: %w (is `openclaw gateway` running?)", c.BaseURL, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, replyError(c.BaseURL, resp, b)
	}
	return resp.Body, nil
}

// replyError is the error of a non-2xx reply: the gateway's JSON error, or a summary of the body.
func replyError(base string, resp *http.Response, b []byte) error {
	var eb struct {
		Error *Error `json:"error"`
	}
	if json.Unmarshal(b, &eb) == nil && eb.Error != nil {
		eb.Error.Status = resp.StatusCode
		return eb.Error
	}
	return &Error{Status: resp.StatusCode, Code: "http", Message: summarizeBody(base, resp, b)}
}

// ExecIO is what one exec or shell reads and writes on the operator's side.
type ExecIO struct {
	// Stdin is sent to the command (nil: an empty stdin); its end closes the command's stdin.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Resize and Signal, when set, carry window changes and signals to the command.
	Resize <-chan [2]int // rows, cols
	Signal <-chan string
}

// inputChunk is the most stdin one frame carries (the gateway takes frames up to 64 KiB).
const inputChunk = 32 << 10

// Exec runs a command (or the shell, with an empty st.Command) on an environment's box through
// the gateway and returns how it ended. The box's stdout and stderr arrive separately.
func (c *Client) Exec(ctx context.Context, id string, st boxaccess.Start, x ExecIO) (boxaccess.Exit, error) {
	u := "ws" + strings.TrimPrefix(c.BaseURL, "http") + v1("environments", id, "exec")
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": []string{"Bearer " + c.Token}},
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			var b []byte
			if resp.Body != nil {
				b, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			}
			return boxaccess.Exit{}, replyError(c.BaseURL, resp, b)
		}
		return boxaccess.Exit{}, fmt.Errorf("gateway at %s: %w", c.BaseURL, err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(2 << 20)
	if err := wsjson.Write(ctx, conn, st); err != nil {
		return boxaccess.Exit{}, fmt.Errorf("start: %w", err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		if x.Stdin != nil {
			buf := make([]byte, 1+inputChunk)
			buf[0] = boxaccess.StreamStdin
			for {
				n, err := x.Stdin.Read(buf[1:])
				if n > 0 && conn.Write(sctx, websocket.MessageBinary, buf[:1+n]) != nil {
					return
				}
				if err != nil {
					break
				}
			}
		}
		_ = wsjson.Write(sctx, conn, boxaccess.Control{Type: boxaccess.ControlEOF})
	}()
	go func() {
		for {
			var m boxaccess.Control
			select {
			case <-sctx.Done():
				return
			case rc := <-x.Resize:
				m = boxaccess.Control{Type: boxaccess.ControlResize, Rows: rc[0], Cols: rc[1]}
			case s := <-x.Signal:
				m = boxaccess.Control{Type: boxaccess.ControlSignal, Signal: s}
			}
			if wsjson.Write(sctx, conn, m) != nil {
				return
			}
		}
	}()
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return boxaccess.Exit{}, ctx.Err()
			}
			return boxaccess.Exit{}, fmt.Errorf("the gateway closed the session without an exit status: %w", err)
		}
		if typ == websocket.MessageBinary {
			if len(b) == 0 {
				continue
			}
			var w io.Writer
			switch b[0] {
			case boxaccess.StreamStdout:
				w = x.Stdout
			case boxaccess.StreamStderr:
				w = x.Stderr
			}
			if w != nil {
				if _, err := w.Write(b[1:]); err != nil {
					return boxaccess.Exit{}, err
				}
			}
			continue
		}
		var m boxaccess.Control
		if err := json.Unmarshal(b, &m); err != nil {
			return boxaccess.Exit{}, fmt.Errorf("bad message from the gateway: %w", err)
		}
		if m.Type == boxaccess.ControlExit && m.Exit != nil {
			_ = conn.Close(websocket.StatusNormalClosure, "")
			return *m.Exit, nil
		}
	}
}
