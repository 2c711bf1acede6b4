package gitsync

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// CheckoutTooLargeError refuses worker commits whose checkout would write more than the inbound
// limits allow; nothing was adopted.
type CheckoutTooLargeError struct {
	What        string
	Have, Limit int64
}

func (e *CheckoutTooLargeError) Error() string {
	return fmt.Sprintf("the worker's commits would check out %s of %d, over the limit of %d; nothing was adopted "+
		"(the profile's sync.maxInboundBytes, sync.maxInboundEntries and sync.maxInboundFileBytes)", e.What, e.Have, e.Limit)
}

// CheckoutSize sums what checking out tip over head writes: the entries added or changed (files
// and symlinks; a submodule's commit writes nothing here) and their blobs' bytes, refusing
// (*CheckoutTooLargeError) past lim's entries, file size or total. A bundle of a few kilobytes can
// point thousands of paths at one large blob: a checkout of terabytes. It is streamed: nothing
// is held but the changed blobs' ids.
func CheckoutSize(ctx context.Context, g *gitexec.Untrusted, head, tip string, lim stream.Limits) (total int64, err error) {
	counts := map[string]int64{} // blob → paths it is written at
	entries := int64(0)
	err = streamLines(ctx, g, func(r *bufio.Reader) error {
		for {
			meta, err := r.ReadString(0)
			if errors.Is(err, io.EOF) && meta == "" {
				return nil
			}
			if err != nil {
				return err
			}
			if _, err := r.ReadString(0); err != nil { // the path
				return err
			}
			// ":<old mode> <new mode> <old id> <new id> <status>"
			f := strings.Fields(strings.TrimPrefix(strings.TrimSuffix(meta, "\x00"), ":"))
			if len(f) != 5 || f[4] == "D" || f[1] == "160000" {
				continue
			}
			if entries++; entries > int64(lim.MaxEntries) {
				return &CheckoutTooLargeError{What: "entries", Have: entries, Limit: int64(lim.MaxEntries)}
			}
			counts[f[3]]++
		}
	}, "diff-tree", "-r", "-z", "--no-renames", head, tip)
	if err != nil || len(counts) == 0 {
		return 0, err
	}
	var in strings.Builder
	for id := range counts {
		in.WriteString(id + "\n")
	}
	err = streamInput(ctx, g, strings.NewReader(in.String()), func(r *bufio.Reader) error {
		for {
			line, err := r.ReadString('\n')
			if errors.Is(err, io.EOF) && line == "" {
				return nil
			}
			if err != nil {
				return err
			}
			f := strings.Fields(line)
			if len(f) != 2 {
				return fmt.Errorf("cat-file: unexpected line %.100q", line)
			}
			size, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return fmt.Errorf("cat-file: unexpected line %.100q", line)
			}
			if size > lim.MaxFileSize {
				return &CheckoutTooLargeError{What: "a file", Have: size, Limit: lim.MaxFileSize}
			}
			if total += size * counts[f[0]]; total > lim.MaxTotalSize || total < 0 {
				return &CheckoutTooLargeError{What: "bytes", Have: total, Limit: lim.MaxTotalSize}
			}
		}
	}, "cat-file", "--batch-check=%(objectname) %(objectsize)")
	return total, err
}

// streamLines runs git args through g and hands its output to read as it comes; the command is
// stopped when read returns.
func streamLines(ctx context.Context, g *gitexec.Untrusted, read func(*bufio.Reader) error, args ...string) error {
	return streamInput(ctx, g, nil, read, args...)
}

func streamInput(ctx context.Context, g *gitexec.Untrusted, stdin io.Reader, read func(*bufio.Reader) error, args ...string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := g.Stream(ctx, stdin, pw, args...)
		pw.CloseWithError(err)
		done <- err
	}()
	rerr := read(bufio.NewReaderSize(pr, 64<<10))
	cancel()
	pr.CloseWithError(errors.New("stopped reading"))
	gerr := <-done
	if rerr != nil {
		return rerr
	}
	return gerr
}
