package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
)

// commands are pki's subcommands; each parses its own flags.
var commands = map[string]func(args []string) error{
	"ca":          caCommand,
	"issue":       issueCommand,
	"signing-key": signingKeyCommand,
	"kubeconfig":  kubeconfigCommand,
}

func dispatch(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: pki ca|issue|signing-key|kubeconfig [flags]")
	}
	cmd, ok := commands[args[0]]
	if !ok {
		return fmt.Errorf("unknown subcommand %q (want ca, issue, signing-key or kubeconfig)", args[0])
	}
	if err := cmd(args[1:]); err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	return nil
}

// parse parses args into fs and wants every named flag set: each subcommand
// writes files whose every input matters, so none has a default.
func parse(fs *pflag.FlagSet, args []string, required ...string) error {
	fs.SetOutput(io.Discard) // errors are returned and printed once, by main
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var missing []string
	for _, name := range required {
		if !fs.Changed(name) {
			missing = append(missing, "--"+name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s", strings.Join(missing, ", "))
	}
	return nil
}

func caCommand(args []string) error {
	fs := pflag.NewFlagSet("ca", pflag.ContinueOnError)
	dir, name, cn := fs.String("dir", "", "the pki dir"), fs.String("name", "", "writes NAME.key and NAME.crt"), fs.String("cn", "", "the CA's common name")
	if err := parse(fs, args, "dir", "name", "cn"); err != nil {
		return err
	}
	return makeCA(*dir, *name, *cn)
}

func issueCommand(args []string) error {
	fs := pflag.NewFlagSet("issue", pflag.ContinueOnError)
	dir, ca, name := fs.String("dir", "", "the pki dir"), fs.String("ca", "", "the signing CA's name"), fs.String("name", "", "writes NAME.key and NAME.crt")
	subject, usage := fs.String("subject", "", "/O=ORG/CN=NAME"), fs.String("usage", "", "client or server")
	san := fs.String("san", "", "subject alternative names: IP:ADDR,DNS:NAME,...")
	if err := parse(fs, args, "dir", "ca", "name", "subject", "usage"); err != nil {
		return err
	}
	req, err := parseRequest(*subject, *usage, *san)
	if err != nil {
		return err
	}
	return issue(*dir, *ca, *name, req)
}

func signingKeyCommand(args []string) error {
	fs := pflag.NewFlagSet("signing-key", pflag.ContinueOnError)
	dir, name := fs.String("dir", "", "the pki dir"), fs.String("name", "", "writes NAME.key and NAME.pub")
	if err := parse(fs, args, "dir", "name"); err != nil {
		return err
	}
	return makeSigningKey(*dir, *name)
}

func kubeconfigCommand(args []string) error {
	fs := pflag.NewFlagSet("kubeconfig", pflag.ContinueOnError)
	var k kubeconfig
	fs.StringVar(&k.server, "server", "", "the apiserver's URL")
	fs.StringVar(&k.caFile, "ca-file", "", "the CA certificate the server's is checked against")
	fs.StringVar(&k.user, "user", "", "the user's name in the kubeconfig")
	fs.StringVar(&k.certFile, "cert", "", "the user's client certificate")
	fs.StringVar(&k.keyFile, "key", "", "the user's key")
	out := fs.String("out", "", "the kubeconfig to write")
	if err := parse(fs, args, "server", "ca-file", "user", "cert", "key", "out"); err != nil {
		return err
	}
	return k.write(*out)
}
