package main

import (
	_ "github.com/coder/websocket"
	_ "github.com/labstack/echo/v4"
	_ "github.com/pkg/sftp"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/spf13/cobra"
	_ "go.yaml.in/yaml/v3"
	_ "golang.org/x/crypto/ssh"
	_ "modernc.org/sqlite"
	_ "github.com/klauspost/compress/zstd"
	_ "golang.org/x/sync/errgroup"
)

func main() {}
