// Package capacitybench measures the gateway's capacity (`make bench`, OPENCLAW_BENCH=1): workers held
// through the real hub, durable writes against the disk's fsync rate, and the box-side figures
// against their peers; nothing here is asserted, it is printed.
package capacitybench
