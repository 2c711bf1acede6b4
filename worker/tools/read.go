package tools

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/openclaw/cloudworkers/protocol"
)

// maxImageBytes bounds an image returned by read.
const maxImageBytes = 5 << 20

var imageTypes = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

type readTool struct{ s *Set }

var _ Tool = (*readTool)(nil)

func (t *readTool) Name() string { return "read" }

func (t *readTool) Schema() protocol.Tool {
	c := t.s.cfg
	return schema("read", fmt.Sprintf("Read the contents of a file. Supports text files and images (jpg, png, gif, webp). "+
		"Text output is truncated to %d lines or %s, whichever comes first; use offset/limit for large files "+
		"(the marker at the end says where to continue).", c.MaxLines, formatSize(c.MaxOutputBytes)),
		`{"type":"object","properties":{`+
			`"path":{"type":"string","description":"Path to the file to read (relative to the workspace, or absolute inside it)"},`+
			`"offset":{"type":"integer","minimum":1,"description":"Line number to start reading from (1-indexed)"},`+
			`"limit":{"type":"integer","minimum":1,"description":"Maximum number of lines to read"}},`+
			`"required":["path"]}`)
}

type readDetails struct {
	Path        string `json:"path"`
	TotalLines  int    `json:"totalLines"`
	StartLine   int    `json:"startLine,omitempty"`
	EndLine     int    `json:"endLine,omitempty"`
	Truncated   bool   `json:"truncated,omitempty"`
	TruncatedBy string `json:"truncatedBy,omitempty"` // lines | bytes | limit
}

func (t *readTool) Run(ctx context.Context, args json.RawMessage) (Result, error) {
	var a struct {
		Path   string `json:"path"`
		Offset optInt `json:"offset"`
		Limit  optInt `json:"limit"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return invalidArgs("read", err), nil
	}
	if a.Path == "" {
		return invalidArgs("read", errors.New("path is required")), nil
	}
	offset := a.Offset.or(1)
	if offset < 1 {
		return invalidArgs("read", fmt.Errorf("offset must be >= 1 (1-indexed line), got %d", offset)), nil
	}
	if a.Limit.Set && a.Limit.V < 1 {
		return invalidArgs("read", fmt.Errorf("limit must be >= 1, got %d", a.Limit.V)), nil
	}
	abs, err := t.s.resolve(a.Path)
	if err != nil {
		return t.s.pathErr("read", a.Path, err), nil
	}
	f, err := os.Open(abs)
	if err != nil {
		return t.s.pathErr("read", a.Path, err), nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return t.s.pathErr("read", a.Path, err), nil
	}
	if fi.IsDir() {
		return errorf("read: %s is a directory; use ls to list it", t.s.display(abs)), nil
	}
	head := make([]byte, 8192)
	n, err := io.ReadFull(f, head)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return t.s.pathErr("read", a.Path, err), nil
	}
	head = head[:n]
	if mime := http.DetectContentType(head); imageTypes[mime] {
		return t.readImage(f, abs, head, fi.Size(), mime)
	}
	if isBinary(head) {
		return errorf("read: %s is a binary file (%d bytes); not shown", t.s.display(abs), fi.Size()), nil
	}

	c := t.s.cfg
	maxLines := c.MaxLines
	if a.Limit.Set && a.Limit.V < maxLines {
		maxLines = a.Limit.V
	}
	r := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(head), f), 64<<10)
	var (
		out     bytes.Buffer
		buf     []byte
		lineNo  int
		shown   int
		stopped string
	)
	for {
		if lineNo%4096 == 0 && ctx.Err() != nil {
			return errorf("read: %s: %v", t.s.display(abs), ctx.Err()), nil
		}
		var full int
		var rerr error
		buf, full, rerr = readLine(r, c.MaxOutputBytes, buf)
		if full == 0 && rerr != nil {
			if rerr != io.EOF {
				return t.s.pathErr("read", a.Path, rerr), nil
			}
			break
		}
		lineNo++
		if lineNo >= offset && stopped == "" {
			line, cut := trimEOL(buf, full, rerr == nil)
			switch {
			case shown >= maxLines && a.Limit.Set && maxLines == a.Limit.V:
				stopped = "limit"
			case shown >= maxLines:
				stopped = "lines"
			case shown > 0 && out.Len()+len(line)+1 > c.MaxOutputBytes:
				stopped = "bytes"
			default:
				if shown > 0 {
					out.WriteByte('\n')
				}
				out.Write(line)
				if cut > 0 {
					fmt.Fprintf(&out, " [... line %d truncated: %d more bytes]", lineNo, cut)
				}
				shown++
			}
		}
		if rerr == io.EOF {
			break
		}
	}
	d := readDetails{Path: t.s.display(abs), TotalLines: lineNo}
	if lineNo == 0 {
		if offset > 1 {
			return errorf("read: offset %d is beyond the end of %s (file is empty)", offset, d.Path), nil
		}
		return withDetails(textResult("(file is empty)"), d), nil
	}
	if offset > lineNo {
		return errorf("read: offset %d is beyond the end of %s (%d lines)", offset, d.Path, lineNo), nil
	}
	d.StartLine, d.EndLine = offset, offset+shown-1
	if rest := lineNo - d.EndLine; rest > 0 {
		d.Truncated, d.TruncatedBy = true, stopped
		if stopped == "bytes" {
			fmt.Fprintf(&out, "\n\n[... %d more lines; output limit of %s reached; use offset=%d to continue]", rest, formatSize(c.MaxOutputBytes), d.EndLine+1)
		} else {
			fmt.Fprintf(&out, "\n\n[... %d more lines; use offset=%d to continue]", rest, d.EndLine+1)
		}
	}
	return withDetails(textResult(out.String()), d), nil
}

func (t *readTool) readImage(f *os.File, abs string, head []byte, size int64, mime string) (Result, error) {
	if size > maxImageBytes {
		return errorf("read: image %s is %d bytes, over the %s limit", t.s.display(abs), size, formatSize(maxImageBytes)), nil
	}
	rest, err := io.ReadAll(io.LimitReader(f, maxImageBytes))
	if err != nil {
		return t.s.pathErr("read", t.s.display(abs), err), nil
	}
	data := append(head, rest...)
	return withDetails(Result{Content: []protocol.Content{
		{Type: protocol.ContentText, Text: fmt.Sprintf("Read image file %s [%s, %d bytes]", t.s.display(abs), mime, len(data))},
		{Type: protocol.ContentImage, MimeType: mime, Data: base64.StdEncoding.EncodeToString(data)},
	}}, map[string]any{"path": t.s.display(abs), "mimeType": mime, "bytes": len(data)}), nil
}

// readLine reads one line into buf (reused), keeping at most keep bytes of it. full is the
// line's length including its newline; it is 0 only at the end of the input.
func readLine(r *bufio.Reader, keep int, buf []byte) (line []byte, full int, err error) {
	buf = buf[:0]
	for {
		frag, err := r.ReadSlice('\n')
		full += len(frag)
		if room := keep - len(buf); room > 0 {
			buf = append(buf, frag[:min(room, len(frag))]...)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return buf, full, err
	}
}

// trimEOL strips the line ending from a line kept by readLine and says how many bytes of the
// line (without its ending) were not kept; newline says the line ended with one.
func trimEOL(kept []byte, full int, newline bool) (line []byte, cut int) {
	line = kept
	if len(kept) == full {
		line = bytes.TrimSuffix(line, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		return line, 0
	}
	line = kept[:runeStart(kept, len(kept))]
	cut = full - len(line)
	if newline {
		cut--
	}
	return line, cut
}
