package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// Validity: the CA outlives any test run many times over; leaf certs are
// made fresh on every cold start of the cluster.
const (
	caValidity   = 3650 * 24 * time.Hour
	leafValidity = 365 * 24 * time.Hour
)

// makeCA writes a self-signed CA (DIR/NAME.crt) and its key (DIR/NAME.key).
// EC P-256 keys, here and for every cert: they generate in milliseconds and
// Go's TLS accepts them. client-go's cert.NewSelfSignedCACert is not used:
// it adds keyEncipherment and a DNS SAN, this CA has exactly the usages a
// CA needs. CreateCertificate fills in a random serial and the key id.
func makeCA(dir, name, cn string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating a key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now,
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return fmt.Errorf("signing the CA certificate: %w", err)
	}
	return writePair(dir, name, der, key)
}

// issue writes a key (DIR/NAME.key) and a certificate for it
// (DIR/NAME.crt) that the CA DIR/CA.{crt,key} signs.
func issue(dir, ca, name string, r request) error {
	caCert, caKey, err := loadCA(dir, ca)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating a key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:               r.subject,
		NotBefore:             now,
		NotAfter:              now.Add(leafValidity),
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{r.usage},
		DNSNames:              r.dns,
		IPAddresses:           r.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
	if err != nil {
		return fmt.Errorf("signing %s with %s: %w", name, ca, err)
	}
	return writePair(dir, name, der, key)
}

// loadCA reads DIR/CA.crt and DIR/CA.key as makeCA wrote them.
func loadCA(dir, ca string) (*x509.Certificate, crypto.Signer, error) {
	certs, err := cert.CertsFromFile(filepath.Join(dir, ca+".crt"))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the CA %s: %w", ca, err)
	}
	key, err := keyutil.PrivateKeyFromFile(filepath.Join(dir, ca+".key"))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the CA %s: %w", ca, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("the CA key %s.key cannot sign (%T)", ca, key)
	}
	return certs[0], signer, nil
}

// writePair writes DIR/NAME.crt (0644) and DIR/NAME.key (0600).
func writePair(dir, name string, der []byte, key crypto.PrivateKey) error {
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return fmt.Errorf("encoding the key of %s: %w", name, err)
	}
	if err := keyutil.WriteKey(filepath.Join(dir, name+".key"), keyPEM); err != nil {
		return fmt.Errorf("writing the key of %s: %w", name, err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: cert.CertificateBlockType, Bytes: der})
	if err := cert.WriteCert(filepath.Join(dir, name+".crt"), certPEM); err != nil {
		return fmt.Errorf("writing the certificate of %s: %w", name, err)
	}
	return nil
}

// makeSigningKey writes an RSA key (DIR/NAME.key) and its public half
// (DIR/NAME.pub) for signing service-account tokens: RSA because RS256 is
// what every token consumer supports.
func makeSigningKey(dir, name string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generating an RSA key: %w", err)
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return fmt.Errorf("encoding the key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return fmt.Errorf("encoding the public key: %w", err)
	}
	if err := keyutil.WriteKey(filepath.Join(dir, name+".key"), keyPEM); err != nil {
		return fmt.Errorf("writing the key: %w", err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: keyutil.PublicKeyBlockType, Bytes: pub})
	if err := os.WriteFile(filepath.Join(dir, name+".pub"), pubPEM, 0o644); err != nil { //nolint:gosec // G306: a public key, which the API server reads; nothing secret
		return fmt.Errorf("writing the public key: %w", err)
	}
	return nil
}
