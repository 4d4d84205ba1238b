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

package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// observationTimeout bounds one certify observation: the inventories are asked only once no
// admission or eviction is in flight, and a worker's call is bounded by the host.
const observationTimeout = 2 * time.Minute

// recordObservations records a certify observation every StatusInterval, if certify
// observation is on.
func (a *Agent) recordObservations(ctx context.Context) error {
	if a.cfg.CertifyObservation == "" {
		return nil
	}
	ticker := a.cfg.Clock.NewTicker(a.cfg.StatusInterval)
	defer ticker.Stop()
	for {
		if err := a.recordObservation(ctx); err != nil {
			a.cfg.Log.Error(err, "recording a certify observation")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		}
	}
}

// recordObservation asks the supervisor for one observation, lanes that are loading or
// recovering included (without an inventory, and saying why), and writes it, whole or not at
// all, where synapse-certify reads it.
func (a *Agent) recordObservation(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, observationTimeout)
	defer cancel()
	obs, err := a.sup.Observe(ctx)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(obs, "", "  ")
	if err != nil {
		return err
	}
	path := a.cfg.CertifyObservation
	tmp, err := os.CreateTemp(filepath.Dir(path), ".observation-*")
	if err != nil {
		return fmt.Errorf("writing the observation: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("writing the observation: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing the observation: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("publishing the observation: %w", err)
	}
	return nil
}
