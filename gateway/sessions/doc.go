// Package sessions stores sessions, their transcript trees and live events, and fans live events out to
// subscribers; local and worker placements both write through it.
package sessions
