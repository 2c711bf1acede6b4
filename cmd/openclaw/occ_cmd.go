package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/occ"
)

func newOCCCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "occ",
		Example: `  openclaw occ token`,
		Short:   "The OCC Compute side of this gateway (/occ/v1/, see docs/occ.md)",
	}
	cmd.AddCommand(newOCCTokenCmd(g))
	return cmd
}

func newOCCTokenCmd(g *globals) *cobra.Command {
	return tokenCmd(g, "occ", "Print OCC's bearer token (<data-dir>/occ.token), or replace it",
		`OCC calls /occ/v1/ with its own bearer token, kept in <data-dir>/occ.token (mode 0600) and separate
from the operator's gateway.token. It is generated on the gateway's first start (or here, if missing).
--rotate writes a new token: the old one is refused at once, also by a running gateway.`,
		"replace the token; the old one stops working at once",
		func(dir string, rotate bool) (string, error) {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return "", fmt.Errorf("create data dir: %w", err)
			}
			if rotate {
				return occ.RotateToken(dir)
			}
			return occ.EnsureToken(dir)
		})
}
