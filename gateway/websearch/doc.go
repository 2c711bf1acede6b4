// Package websearch is the gateway-resident web_search tool, backed by the Brave Search API with a
// credential that never leaves the gateway.
package websearch
