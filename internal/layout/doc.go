// Package layout holds no code: its test reads the import graph (go list) and fails on an
// import that runs from a lower floor of the tree to a higher one. The floors, lowest first:
//
//  1. internal/ (primitives: clock, backoff, atomicfile, untrusted text, field errors, …) and
//     protocol/ (the wire between gateway and worker);
//  2. providers/, sync/, worker/, ui/ (the parts: leasing, workspace sync, the worker's loop,
//     the UI's files);
//  3. gateway/ (the engine and its doors);
//  4. cmd/ (the binary, and product code only it uses under cmd/openclaw/internal) and
//     examples/ (programs beside it: the example lease CLIs).
//
// Test rigs (internal/testrig/…, and the <name>test packages beside a package) may import any
// floor, and only tests import them.
package layout
