// Package inference is the gateway's model catalog and the contract of its provider adapters, which
// stream model calls in the upstream event vocabulary.
package inference
