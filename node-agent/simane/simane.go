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

// Package simane is a faithful stand-in for the Apple Neural Engine and aned, for tests and
// for Linux: the compiler serves one layer at a time for the whole machine, a layer's compile
// cost grows with its rung, compiled programs are cached on disk keyed by content identifier
// and the worker's code-signing identifier, a cached program loads in milliseconds without
// writing sources or compiling, resident programs are limited (a load past the limit is
// refused as resources exhausted), and only a compile writes to the temporary folder, so only
// a compile can be refused for lack of temp space. Faults can be injected.
//
// Time passes on an injected clock, scaled by Config.Scale, so tests run on a fake clock and
// the stress tool can run seed-scale timings in seconds.
package simane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/utils/clock"
)

var (
	// ErrResourcesExhausted: the device cannot hold another program (ane_resources_exhausted).
	ErrResourcesExhausted = errors.New("ane_resources_exhausted: the Neural Engine cannot hold another program")
	// ErrTempSpaceLow: the compiler's temporary folder lacks room for the layer's sources.
	ErrTempSpaceLow = errors.New("ane_temp_space_low: not enough temporary space to compile")
	// ErrCompileFailed: the compiler failed (an injected fault).
	ErrCompileFailed = errors.New("ANECCompile() FAILED")
)

// Layer is one per-layer program: what aned compiles and caches.
type Layer struct {
	// Model is the model's certified identity; WeightsDigest the layer's weights.
	Model         string
	Index         int
	Rung          int
	WeightsDigest string
}

// ContentID is the program's content identifier, <mil>_<weights>_<options> hashes as the
// real framework reports it: the same layer at the same rung always has the same identifier.
func (l Layer) ContentID() string {
	mil := sha256.Sum256([]byte(fmt.Sprintf("program(1.3) %s layer %d [1, C, 1, %d]", l.Model, l.Index, l.Rung)))
	weights := sha256.Sum256([]byte(l.WeightsDigest))
	options := sha256.Sum256([]byte("{}"))
	return hex.EncodeToString(mil[:8]) + "_" + hex.EncodeToString(weights[:8]) + "_" + hex.EncodeToString(options[:8])
}

// Config sets the stand-in's machine.
type Config struct {
	Clock clock.Clock
	// Scale multiplies every simulated duration; 1 is seed scale, 0.001 makes minutes into
	// tenths of a second. Zero means 1.
	Scale float64
	// ProgramLimit is how many programs the machine can hold resident, all processes together
	// (with Dir set); zero means 120.
	ProgramLimit int
	// TempSpace is the free temporary space in bytes; zero means plenty.
	TempSpace int64
	// LayerSourceBytes is what one compile writes to the temporary folder; zero means 4 MiB.
	LayerSourceBytes int64
	// Dir, when set, keeps aned's cache on disk under Dir and serialises compiles across
	// processes with a lock file there, as the real aned and compiler do for every process of
	// the machine: a restarted worker finds what its predecessor compiled. Empty keeps both in
	// this process.
	Dir string
}

// Machine is one simulated Mac: its Neural Engine and its aned.
type Machine struct {
	// id tells this machine's residency record from other stand-ins in the same process.
	id       int64
	clk      clock.Clock
	scale    float64
	limit    int
	srcBytes int64
	compiler sync.Mutex // the machine-wide compiler: one layer at a time
	dir      string

	mu       sync.Mutex
	cache    map[cacheKey]bool
	resident int
	tempFree int64
	compiles int
	written  int64
	faults   Faults
}

type cacheKey struct{ contentID, signingID string }

// Faults are one-shot failures to inject; each is consumed by the call it affects.
type Faults struct {
	// FailNextCompile makes the next layer compile fail.
	FailNextCompile bool
	// HangNextCompile makes the next layer compile never finish (until its context ends).
	HangNextCompile bool
	// CorruptNextCachedLoad makes the next cached load find an unusable copy, which falls back
	// to a compile.
	CorruptNextCachedLoad bool
}

var machines atomic.Int64

// New returns a machine with an empty cache and nothing resident.
func New(cfg Config) *Machine {
	m := &Machine{id: machines.Add(1), clk: cfg.Clock, scale: cfg.Scale, limit: cfg.ProgramLimit, srcBytes: cfg.LayerSourceBytes,
		cache: map[cacheKey]bool{}, tempFree: cfg.TempSpace, dir: cfg.Dir}
	if m.scale == 0 {
		m.scale = 1
	}
	if m.limit == 0 {
		m.limit = 120
	}
	if m.srcBytes == 0 {
		m.srcBytes = 4 << 20
	}
	if m.tempFree == 0 {
		m.tempFree = math.MaxInt64
	}
	return m
}

// Inject arms faults.
func (m *Machine) Inject(f Faults) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults = f
}

// SetTempSpace sets the free temporary space.
func (m *Machine) SetTempSpace(bytes int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tempFree = bytes
}

// Stats reports what the machine did: layer compiles and bytes written to the temp folder.
func (m *Machine) Stats() (compiles int, written int64, resident int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.compiles, m.written, m.resident
}

// Cached reports whether aned holds the layer compiled for signingID
// (compiledModelExists).
func (m *Machine) Cached(signingID string, l Layer) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cachedLocked(cacheKey{l.ContentID(), signingID})
}

func (m *Machine) cachedLocked(k cacheKey) bool {
	if m.dir == "" {
		return m.cache[k]
	}
	_, err := os.Stat(m.cachePath(k))
	return err == nil
}

func (m *Machine) storeLocked(k cacheKey, present bool) error {
	if m.dir == "" {
		if present {
			m.cache[k] = true
		} else {
			delete(m.cache, k)
		}
		return nil
	}
	p := m.cachePath(k)
	if !present {
		return os.Remove(p)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, nil, 0o644)
}

// cachePath partitions aned's cache by signing identifier, as aned does.
func (m *Machine) cachePath(k cacheKey) string {
	return filepath.Join(m.dir, "aned", k.signingID, k.contentID)
}

// LayerCompileTime and LayerLoadTime follow the seed's measurements: a layer compiles in
// 0.37 s at rung 128 and 15.8 s at 4096, and a cached one loads in 3.5 to 45 ms.
func LayerCompileTime(rung int) time.Duration {
	return powerLaw(370*time.Millisecond, 15800*time.Millisecond, rung)
}

// LayerLoadTime is the load time of one cached layer at rung.
func LayerLoadTime(rung int) time.Duration {
	return powerLaw(3500*time.Microsecond, 45*time.Millisecond, rung)
}

func powerLaw(at128, at4096 time.Duration, rung int) time.Duration {
	exp := math.Log(float64(at4096)/float64(at128)) / math.Log(32)
	return time.Duration(float64(at128) * math.Pow(float64(rung)/128, exp))
}

// Outcome says how a layer became resident.
type Outcome struct {
	FromCache bool
}

// Load makes a layer resident for a worker signed signingID: from aned's cache when it holds
// the program (no sources written, no compile), otherwise by compiling it, one layer at a time
// for the whole machine. A cached load the device refuses for resources is returned at once,
// without compiling; only an unusable cached copy falls back to a compile.
func (m *Machine) Load(ctx context.Context, signingID string, l Layer) (Outcome, error) {
	key := cacheKey{l.ContentID(), signingID}
	m.mu.Lock()
	cached := m.cachedLocked(key)
	if cached && m.faults.CorruptNextCachedLoad {
		m.faults.CorruptNextCachedLoad = false
		_ = m.storeLocked(key, false)
		cached = false
	}
	m.mu.Unlock()

	if cached {
		if err := m.wait(ctx, LayerLoadTime(l.Rung)); err != nil {
			return Outcome{}, err
		}
		return Outcome{FromCache: true}, m.place()
	}
	if err := m.compile(ctx, key, l); err != nil {
		return Outcome{}, err
	}
	if err := m.wait(ctx, LayerLoadTime(l.Rung)); err != nil {
		return Outcome{}, err
	}
	return Outcome{}, m.place()
}

// place takes a resident program slot. The limit is the machine's, as aned's is: with Dir set,
// the programs every live process of the machine holds count against it.
func (m *Machine) place() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dir == "" {
		if m.resident >= m.limit {
			return ErrResourcesExhausted
		}
		m.resident++
		return nil
	}
	return m.withResidency(func(others int) error {
		if others+m.resident >= m.limit {
			return ErrResourcesExhausted
		}
		m.resident++
		return nil
	})
}

// Unload releases a resident program slot.
func (m *Machine) Unload() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.resident == 0 {
		return
	}
	if m.dir == "" {
		m.resident--
		return
	}
	// The local count drops first: the device frees the program whatever the shared record says.
	// A record left unwritten overstates what this process holds, so the other processes see
	// less room, never more (it is rewritten at the next load or unload, and dropped when the
	// process ends).
	m.resident--
	_ = m.withResidency(func(int) error { return nil })
}

// withResidency runs f under the machine-wide residency lock with the programs the machine's
// other live processes hold, then records this process's count. A process that died holds
// nothing: the device frees a process's programs when it ends.
func (m *Machine) withResidency(f func(others int) error) error {
	dir := filepath.Join(m.dir, "resident")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(m.dir, "resident.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("taking the residency lock: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	self := fmt.Sprintf("%d-%d", os.Getpid(), m.id)
	others := 0
	for _, e := range entries {
		pidText, _, _ := strings.Cut(e.Name(), "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || e.Name() == self {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = os.Remove(filepath.Join(dir, e.Name()))
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			// Records are written whole under the lock; one that does not parse is not guessed at.
			return fmt.Errorf("the residency record %s is malformed: %w", e.Name(), err)
		}
		others += n
	}
	if err := f(others); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, self), []byte(strconv.Itoa(m.resident)), 0o644)
}

func (m *Machine) compile(ctx context.Context, key cacheKey, l Layer) error {
	m.mu.Lock()
	if m.tempFree < m.srcBytes {
		m.mu.Unlock()
		return fmt.Errorf("compiling %s: %w", key.contentID, ErrTempSpaceLow)
	}
	m.mu.Unlock()

	m.compiler.Lock()
	defer m.compiler.Unlock()
	if m.dir != "" {
		unlock, err := m.lockCompiler()
		if err != nil {
			return err
		}
		defer unlock()
	}
	m.mu.Lock()
	m.written += m.srcBytes // model.mil and weights/weight.bin under the per-user temp folder
	m.compiles++
	f := m.faults
	m.faults.FailNextCompile, m.faults.HangNextCompile = false, false
	m.mu.Unlock()
	if f.HangNextCompile {
		<-ctx.Done()
		return ctx.Err()
	}
	if err := m.wait(ctx, LayerCompileTime(l.Rung)); err != nil {
		return err
	}
	if f.FailNextCompile {
		return fmt.Errorf("compiling %s: %w", key.contentID, ErrCompileFailed)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.storeLocked(key, true)
}

// lockCompiler takes the machine-wide compiler lock shared by every process using Dir.
func (m *Machine) lockCompiler() (func(), error) {
	if err := os.MkdirAll(m.dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(m.dir, "compiler.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("taking the compiler lock: %w", err)
	}
	return func() { f.Close() }, nil
}

func (m *Machine) wait(ctx context.Context, d time.Duration) error {
	d = time.Duration(float64(d) * m.scale)
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-m.clk.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
