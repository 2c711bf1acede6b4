package gitsync

import (
	"bufio"
	"context"
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
// is held but the changed blobs' ids (the listing goes through scanDiff, as CheckCommits's does).
func CheckoutSize(ctx context.Context, g *gitexec.Untrusted, head, tip string, lim stream.Limits) (total int64, err error) {
	counts := map[string]int64{} // blob → paths it is written at
	entries := int64(0)
	err = streamGit(ctx, g, nil, func(r io.Reader) error {
		return scanDiff(r, func(_, mode, blob, status, _ string) error {
			if status == "D" || mode == "160000" { // a submodule's commit writes nothing here
				return nil
			}
			if entries++; entries > int64(lim.MaxEntries) {
				return &CheckoutTooLargeError{What: "entries", Have: entries, Limit: int64(lim.MaxEntries)}
			}
			counts[blob]++
			return nil
		})
	}, "list the worker's checkout", "diff-tree", "-r", "-z", "--no-renames", head, tip)
	if err != nil || len(counts) == 0 {
		return 0, err
	}
	var in strings.Builder
	for id := range counts {
		in.WriteString(id + "\n")
	}
	err = streamGit(ctx, g, strings.NewReader(in.String()), func(r io.Reader) error {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 2 {
				return fmt.Errorf("cat-file: unexpected line %.100q", sc.Text())
			}
			size, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return fmt.Errorf("cat-file: unexpected line %.100q", sc.Text())
			}
			if size > lim.MaxFileSize {
				return &CheckoutTooLargeError{What: "a file", Have: size, Limit: lim.MaxFileSize}
			}
			if total += size * counts[f[0]]; total > lim.MaxTotalSize || total < 0 {
				return &CheckoutTooLargeError{What: "bytes", Have: total, Limit: lim.MaxTotalSize}
			}
		}
		return sc.Err()
	}, "size the worker's checkout", "cat-file", "--batch-check=%(objectname) %(objectsize)")
	return total, err
}
