// Command steve runs Rancher's Steve (github.com/rancher/steve, the release
// pinned in go.mod) for the end-to-end tests: the server Rancher's cluster
// explorer talks to, built as Steve's own main builds it (its flags, its
// server.New), but serving plain HTTP on one loopback address only. Steve's
// own main listens on every interface, on fixed ports, and also serves HTTPS
// with certificates it stores as Secrets in the cluster.
package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/rancher/steve/pkg/debug"
	stevecli "github.com/rancher/steve/pkg/server/cli"
	"github.com/rancher/wrangler/v3/pkg/signals"
	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
)

func main() {
	var (
		config      stevecli.Config
		debugConfig debug.Config
		listen      string
		dataDir     string
	)
	app := cli.NewApp()
	app.Name = "steve"
	app.Usage = "Rancher's Steve on one loopback address, for the test bed"
	// Steve's flags minus its listeners, plus ours.
	app.Flags = append(
		withoutListeners(stevecli.Flags(&config)),
		append(debug.Flags(&debugConfig),
			&cli.StringFlag{
				Name:        "listen",
				Usage:       "loopback address and port to serve plain HTTP on",
				Value:       "127.0.0.1:0",
				Destination: &listen,
			},
			&cli.StringFlag{
				Name:        "data-dir",
				Usage:       "directory for the SQL cache's database (Steve writes it in its working directory)",
				Destination: &dataDir,
			},
		)...)
	app.Action = func(*cli.Context) error {
		return run(&config, &debugConfig, listen, dataDir)
	}
	if err := app.Run(os.Args); err != nil {
		logrus.Fatal(err)
	}
}

// withoutListeners drops Steve's --https-listen-port and --http-listen-port:
// this command serves on --listen alone.
func withoutListeners(flags []cli.Flag) []cli.Flag {
	kept := flags[:0]
	for _, flag := range flags {
		if name := flag.Names()[0]; !strings.HasSuffix(name, "-listen-port") {
			kept = append(kept, flag)
		}
	}
	return kept
}

func run(config *stevecli.Config, debugConfig *debug.Config, listen, dataDir string) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--listen %q: not a loopback address", listen)
	}
	if dataDir != "" {
		if err := os.Chdir(dataDir); err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
	}
	ctx := signals.SetupSignalContext()
	if err := debugConfig.SetupDebug(); err != nil {
		return err
	}
	steve, err := config.ToServer(ctx, debugConfig.SQLCache)
	if err != nil {
		return err
	}
	listener, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	// The test bed reads this line for the port when --listen asks for port 0.
	fmt.Printf("steve: serving on http://%s\n", listener.Addr())
	server := &http.Server{Handler: steve}
	go func() {
		<-ctx.Done()
		_ = server.Close()
	}()
	if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
