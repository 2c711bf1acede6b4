//go:build !race

package stream

// raceEnabled is 1 under the race detector.
const raceEnabled = 0
