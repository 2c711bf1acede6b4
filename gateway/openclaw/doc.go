// Package openclaw serves OpenClaw's Gateway WebSocket protocol (version 4) to OpenClaw's own
// clients — its Control UI, `openclaw tui`, `openclaw gateway call`, `openclaw agent` and
// openclaw-node — as a door onto the same sessions, turns, placements and live feed as /api/v1:
// it translates, and keeps no state of its own but per-connection subscriptions.
package openclaw
