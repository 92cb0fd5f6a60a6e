package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// TestPKI issues a CA, a client and a server cert as up.sh does, checks
// their chain and usages with crypto/x509, and has a client built from the
// written kubeconfig (clientcmd) do a mutual-TLS request to a server using
// the server cert.
func TestPKI(t *testing.T) {
	dir := t.TempDir()
	run(t, "ca", "--dir", dir, "--name", "ca", "--cn", "carve-test-ca")
	run(t, "issue", "--dir", dir, "--ca", "ca", "--name", "admin", "--subject", "/O=system:masters/CN=carve-admin", "--usage", "client")
	run(t, "issue", "--dir", dir, "--ca", "ca", "--name", "apiserver", "--subject", "/CN=kube-apiserver", "--usage", "server",
		"--san", "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes.default.svc")

	ca := load(t, dir, "ca")
	if !ca.IsCA || ca.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign|x509.KeyUsageDigitalSignature || ca.Subject.CommonName != "carve-test-ca" {
		t.Errorf("CA: IsCA %v, key usage %b, subject %s", ca.IsCA, ca.KeyUsage, ca.Subject)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)

	admin := load(t, dir, "admin")
	if admin.IsCA || admin.KeyUsage != x509.KeyUsageDigitalSignature|x509.KeyUsageKeyEncipherment ||
		admin.Subject.CommonName != "carve-admin" || !slices.Equal(admin.Subject.Organization, []string{"system:masters"}) {
		t.Errorf("admin: IsCA %v, key usage %b, subject %s", admin.IsCA, admin.KeyUsage, admin.Subject)
	}
	verify(t, admin, roots, x509.ExtKeyUsageClientAuth, "", true)
	verify(t, admin, roots, x509.ExtKeyUsageServerAuth, "", false)

	server := load(t, dir, "apiserver")
	for _, name := range []string{"127.0.0.1", "10.96.0.1", "localhost", "kubernetes.default.svc"} {
		verify(t, server, roots, x509.ExtKeyUsageServerAuth, name, true)
	}
	verify(t, server, roots, x509.ExtKeyUsageServerAuth, "elsewhere.example", false)
	verify(t, server, roots, x509.ExtKeyUsageClientAuth, "", false)

	checkKubeconfig(t, dir, roots)
}

// checkKubeconfig writes admin's kubeconfig, loads it with clientcmd and
// talks to a TLS server that wants a client cert from the CA.
func checkKubeconfig(t *testing.T, dir string, roots *x509.CertPool) {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(r.TLS.PeerCertificates[0].Subject.CommonName)) //nolint:gosec // G705: a test server echoing the client certificate it verified
	}))
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key"))
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: roots}
	srv.StartTLS()
	defer srv.Close()

	file := filepath.Join(dir, "admin.kubeconfig")
	run(t, "kubeconfig", "--out", file, "--server", srv.URL, "--ca-file", filepath.Join(dir, "ca.crt"),
		"--user", "carve-admin", "--cert", filepath.Join(dir, "admin.crt"), "--key", filepath.Join(dir, "admin.key"))
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("kubeconfig mode: %v, %v", st, err)
	}
	cfg, err := clientcmd.LoadFromFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CurrentContext != "carve" || cfg.Contexts["carve"].AuthInfo != "carve-admin" {
		t.Errorf("context %q: %+v", cfg.CurrentContext, cfg.Contexts)
	}
	restCfg, err := clientcmd.NewDefaultClientConfig(*cfg, nil).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	client, err := rest.HTTPClientFor(restCfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatalf("mutual TLS with the kubeconfig's credentials: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("status %s", resp.Status)
	}
}

func TestKeys(t *testing.T) {
	dir := t.TempDir()
	run(t, "ca", "--dir", dir, "--name", "ca", "--cn", "c")
	key, err := keyutil.PrivateKeyFromFile(filepath.Join(dir, "ca.key"))
	if ec, ok := key.(*ecdsa.PrivateKey); err != nil || !ok || ec.Curve != elliptic.P256() {
		t.Errorf("CA key %T, %v: want EC P-256", key, err)
	}
	if st, err := os.Stat(filepath.Join(dir, "ca.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key mode: %v, %v", st, err)
	}
	run(t, "signing-key", "--dir", dir, "--name", "sa")
	key, err = keyutil.PrivateKeyFromFile(filepath.Join(dir, "sa.key"))
	rsaKey, ok := key.(*rsa.PrivateKey)
	if err != nil || !ok || rsaKey.N.BitLen() != 2048 {
		t.Fatalf("sa key %T, %v: want RSA 2048", key, err)
	}
	pubs, err := keyutil.PublicKeysFromFile(filepath.Join(dir, "sa.pub"))
	if err != nil || len(pubs) != 1 || !rsaKey.PublicKey.Equal(pubs[0]) {
		t.Errorf("sa.pub: %v, %d keys, or not sa.key's", err, len(pubs))
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{},
		{"nope"},
		{"ca", "--dir", dir, "--name", "ca"}, // no --cn
		{"issue", "--dir", dir, "--ca", "missing", "--name", "x", "--subject", "/CN=x", "--usage", "client"},
		{"issue", "--dir", dir, "--ca", "ca", "--name", "x", "--subject", "CN=x", "--usage", "client"},
		{"issue", "--dir", dir, "--ca", "ca", "--name", "x", "--subject", "/CN=x/OU=y", "--usage", "client"},
		{"issue", "--dir", dir, "--ca", "ca", "--name", "x", "--subject", "/CN=x", "--usage", "peer"},
		{"issue", "--dir", dir, "--ca", "ca", "--name", "x", "--subject", "/CN=x", "--usage", "server"},
		{"issue", "--dir", dir, "--ca", "ca", "--name", "x", "--subject", "/CN=x", "--usage", "server", "--san", "IP:not-an-ip"},
		{"kubeconfig", "--out", filepath.Join(dir, "k"), "--server", "https://x", "--ca-file", "/missing", "--user", "u", "--cert", "/missing", "--key", "/missing"},
	} {
		if err := dispatch(args); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if err := dispatch(args); err != nil {
		t.Fatal(err)
	}
}

func load(t *testing.T, dir, name string) *x509.Certificate {
	t.Helper()
	certs, err := cert.CertsFromFile(filepath.Join(dir, name+".crt"))
	if err != nil {
		t.Fatal(err)
	}
	return certs[0]
}

// verify wants c to chain to roots for usage (and host, if not empty), or
// not to when ok is false.
func verify(t *testing.T, c *x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage, host string, ok bool) {
	t.Helper()
	_, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}, DNSName: host})
	if (err == nil) != ok {
		t.Errorf("%s for usage %v, host %q: %v, want ok=%v", c.Subject, usage, host, err, ok)
	}
}
