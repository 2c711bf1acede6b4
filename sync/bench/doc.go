// Package bench measures workspace sync against rsync over the same SSH link (`make bench`).
package bench
