package main

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"strings"
)

// request is what a leaf certificate says beside its key: the subject, the
// one extended usage and, for a server, the names it serves.
type request struct {
	subject pkix.Name
	usage   x509.ExtKeyUsage
	dns     []string
	ips     []net.IP
}

// parseRequest reads issue's flags: the subject in openssl's /O=a/CN=b form
// (what the scripts and kubeadm's docs write), the usage by name and the
// SANs as openssl's IP:a,DNS:b list.
func parseRequest(subject, usage, sans string) (request, error) {
	var r request
	var err error
	if r.subject, err = parseSubject(subject); err != nil {
		return r, err
	}
	switch usage {
	case "client":
		r.usage = x509.ExtKeyUsageClientAuth
	case "server":
		r.usage = x509.ExtKeyUsageServerAuth
	default:
		return r, fmt.Errorf("--usage %q: want client or server", usage)
	}
	if r.dns, r.ips, err = parseSANs(sans); err != nil {
		return r, err
	}
	if usage == "server" && len(r.dns)+len(r.ips) == 0 {
		// Go clients check the SANs only; a server cert without any serves no one.
		return r, fmt.Errorf("a server certificate needs --san")
	}
	return r, nil
}

// parseSubject reads /O=ORG/CN=NAME: CN once, O any number of times (Go
// orders them O then CN, as these subjects are written).
func parseSubject(s string) (pkix.Name, error) {
	var n pkix.Name
	if !strings.HasPrefix(s, "/") {
		return n, fmt.Errorf("--subject %q: want /O=ORG/CN=NAME", s)
	}
	for _, rdn := range strings.Split(s[1:], "/") {
		key, value, ok := strings.Cut(rdn, "=")
		switch {
		case !ok || value == "":
			return n, fmt.Errorf("--subject %q: %q is not KEY=VALUE", s, rdn)
		case key == "CN" && n.CommonName == "":
			n.CommonName = value
		case key == "O":
			n.Organization = append(n.Organization, value)
		default:
			return n, fmt.Errorf("--subject %q: %s is not one CN or an O", s, key)
		}
	}
	if n.CommonName == "" {
		return n, fmt.Errorf("--subject %q: no CN", s)
	}
	return n, nil
}

// parseSANs reads IP:ADDR,DNS:NAME,...; empty is none.
func parseSANs(s string) (dns []string, ips []net.IP, err error) {
	if s == "" {
		return nil, nil, nil
	}
	for _, san := range strings.Split(s, ",") {
		kind, value, _ := strings.Cut(san, ":")
		switch {
		case kind == "DNS" && value != "":
			dns = append(dns, value)
		case kind == "IP" && net.ParseIP(value) != nil:
			ips = append(ips, net.ParseIP(value))
		default:
			return nil, nil, fmt.Errorf("--san: %q is neither IP:ADDRESS nor DNS:NAME", san)
		}
	}
	return dns, ips, nil
}
