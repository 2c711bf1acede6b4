// Package agents lets an agent dispatch work to cloud workers: it spawns child sessions on
// workers (sessions_spawn), follows them up (sessions_send, sessions_status) and brings their
// results back (sessions_pullback), for the gateway-resident tools and the MCP server alike.
package agents
