package main

import (
	"fmt"
	"os"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// kubeconfig is one user's kubeconfig for the cluster.
type kubeconfig struct {
	server, caFile, user, certFile, keyFile string
}

// write writes it to out with the CA, certificate and key embedded, so it
// stays valid if copied elsewhere; 0600, as it holds a private key.
func (k kubeconfig) write(out string) error {
	ca, err := os.ReadFile(k.caFile)
	if err != nil {
		return fmt.Errorf("reading the CA: %w", err)
	}
	crt, err := os.ReadFile(k.certFile)
	if err != nil {
		return fmt.Errorf("reading the certificate: %w", err)
	}
	key, err := os.ReadFile(k.keyFile)
	if err != nil {
		return fmt.Errorf("reading the key: %w", err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["carve"] = &clientcmdapi.Cluster{Server: k.server, CertificateAuthorityData: ca}
	cfg.AuthInfos[k.user] = &clientcmdapi.AuthInfo{ClientCertificateData: crt, ClientKeyData: key}
	cfg.Contexts["carve"] = &clientcmdapi.Context{Cluster: "carve", AuthInfo: k.user}
	cfg.CurrentContext = "carve"
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	// WriteToFile keeps the mode of a file that was there already.
	if err := os.Chmod(out, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	return nil
}
