// Package builtin lists the inference adapters compiled into openclaw, for explicit wiring in cmd/.
package builtin

import (
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/anthropic"
	"github.com/openclaw/cloudworkers/gateway/inference/openai"
	"github.com/openclaw/cloudworkers/gateway/inference/scripted"
)

// Adapters returns one adapter per supported API kind.
func Adapters() inference.Adapters {
	return inference.Adapters{
		inference.APIAnthropicMessages: anthropic.New(),
		inference.APIOpenAICompletions: openai.NewCompletions(),
		inference.APIOpenAIResponses:   openai.NewResponses(),
		inference.APIScripted:          scripted.New(),
	}
}
