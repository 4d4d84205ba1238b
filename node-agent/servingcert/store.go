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

package servingcert

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/client-go/util/certificate"
)

// pairPrefix names the files of the file store: <prefix>-<time>.pem, and <prefix>-current.pem
// the link to the one in use.
const pairPrefix = "synapse-agent-serving"

// keptPairs is how many certificate files the file store keeps: the current one and the one
// before it. client-go's store writes one per rotation and removes none.
const keptPairs = 2

// notifyingStore tells onUpdate of every certificate stored.
type notifyingStore struct {
	certificate.Store
	onUpdate func(*tls.Certificate)
}

func (n *notifyingStore) Update(cert, key []byte) (*tls.Certificate, error) {
	c, err := n.Store.Update(cert, key)
	if err == nil {
		n.onUpdate(c)
	}
	return c, err
}

// memoryStore keeps the certificate and its key in memory only: a restart requests a new one.
type memoryStore struct {
	mu   sync.Mutex
	cert *tls.Certificate
}

func (m *memoryStore) Current() (*tls.Certificate, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cert == nil {
		// The manager requests a certificate when its store answers this type.
		e := certificate.NoCertKeyError("no serving certificate yet")
		return nil, &e
	}
	return m.cert, nil
}

func (m *memoryStore) Update(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, err
		}
	}
	m.mu.Lock()
	m.cert = &pair
	m.mu.Unlock()
	return &pair, nil
}

// fileStore is client-go's file store in dir (the key is readable by the agent's user only),
// pruned to the last keptPairs certificates after every update.
type fileStore struct {
	certificate.FileStore
	dir string
	log logr.Logger
}

func newFileStore(dir string, log logr.Logger) (*fileStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("the serving certificate's directory: %w", err)
	}
	fs, err := certificate.NewFileStoreWithLogger(log.V(1), pairPrefix, dir, dir, "", "")
	if err != nil {
		return nil, fmt.Errorf("the serving certificate's store in %s: %w", dir, err)
	}
	return &fileStore{FileStore: fs, dir: dir, log: log}, nil
}

func (f *fileStore) Update(cert, key []byte) (*tls.Certificate, error) {
	c, err := f.FileStore.Update(cert, key)
	if err == nil {
		f.prune()
	}
	return c, err
}

// prune removes all but the newest keptPairs certificate files; their names sort by the time
// they were written. A failure is logged: it costs disk space, not service.
func (f *fileStore) prune() {
	pairs, err := filepath.Glob(filepath.Join(f.dir, pairPrefix+"-2*.pem"))
	if err != nil || len(pairs) <= keptPairs {
		return
	}
	slices.Sort(pairs)
	for _, p := range pairs[:len(pairs)-keptPairs] {
		if err := os.Remove(p); err != nil {
			f.log.Error(err, "removing an old serving certificate", "path", p)
		}
	}
}
