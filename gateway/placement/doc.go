// Package placement decides where a session runs: the placement state machine, and the
// dispatcher that moves a session between the gateway and a worker (dispatch, pull-back,
// checkpoints, reclaim) step by step.
package placement
