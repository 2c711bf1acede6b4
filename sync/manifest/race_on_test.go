//go:build race

package manifest

// raceEnabled is 1 under the race detector.
const raceEnabled = 1
