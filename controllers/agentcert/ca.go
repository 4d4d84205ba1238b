/*
Copyright 2026 The Synapse Fleet Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package agentcert

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
)

// CA is the fleet CA: its certificate and key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// PEM is the certificate as PEM, the trust bundle clients get.
	PEM []byte
}

// NewCA makes a self-signed fleet CA valid from now for lifetime.
func NewCA(now time.Time, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "synapse-fleet agent-serving CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(lifetime), IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// ParseCA reads a CA from its PEM certificate and key.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("the fleet CA: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok || !cert.IsCA {
		return nil, errors.New("the fleet CA's certificate is no CA or its key cannot sign")
	}
	return &CA{Cert: cert, Key: signer, PEM: certPEM}, nil
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// Sign issues the serving certificate an approved request asks for, valid from now for the
// request's expirationSeconds (def if unset), at most max and never past the CA's own expiry.
func (ca *CA) Sign(req *x509.CertificateRequest, usages []certificatesv1.KeyUsage, expirationSeconds *int32, now time.Time, def, maxLife time.Duration) ([]byte, error) {
	life := def
	if expirationSeconds != nil {
		life = time.Duration(*expirationSeconds) * time.Second
	}
	life = min(life, maxLife)
	notAfter := now.Add(life)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: req.Subject, DNSNames: req.DNSNames, IPAddresses: req.IPAddresses,
		// A little back-dated, as the kube-controller-manager's signer does, for clocks a little behind.
		NotBefore: now.Add(-5 * time.Minute), NotAfter: notAfter, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, u := range usages {
		switch u {
		case certificatesv1.UsageDigitalSignature:
			tmpl.KeyUsage |= x509.KeyUsageDigitalSignature
		case certificatesv1.UsageKeyEncipherment:
			tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, req.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}
