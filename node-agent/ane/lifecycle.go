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

package ane

import (
	"errors"
	"fmt"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// Origin says how a loaded program got onto the device.
type Origin string

const (
	// FromAned: -compiledModelExists said aned holds the program, and it loaded without a
	// compile (maderix/ANE training/ane_runtime.h checks it; jafreck/ironmill
	// crates/ironmill-ane-sys/src/model.rs wraps it).
	FromAned Origin = "aned cache"
	// FromKept: aned did not say so, but the kept compiled folder was restored and the
	// program loaded from it without a compile (maderix/h3.c-ane h3_ane_bridge.m).
	FromKept Origin = "kept folder"
	// FromCompile: the program was compiled in this process, first or after a held program
	// failed to load (compile once, then load: the seed's rule).
	FromCompile Origin = "compiled"
)

// framework is the calls on one in-memory model that the load sequence makes: the private
// API on a Mac (model_darwin_arm64.go), a fake device in tests.
type framework interface {
	compiledModelExists() (bool, error)
	compile() error
	load() error
	unload() error
}

// Trace, when set, is told each framework call just before it is made ("compile
// 4f1c..._..."): the ladder prints it, so a process that dies inside the framework leaves its
// last step behind. It must not block.
var Trace func(step string)

func trace(call, id string) {
	if t := Trace; t != nil {
		t(call + " " + id)
	}
}

// lifecycle is the cache design of one model, independent of the framework: the sources are
// written only to compile, a compiled folder is kept once the program loads, and a held
// program's kept folder is restored before it loads.
type lifecycle struct {
	src  Sources
	id   string
	prog mil.Program
	fw   framework
	// held is what the last cache check found ("" for nothing); compiled: this model
	// compiled since.
	held     Origin
	compiled bool
	origin   Origin
	// keepErr is why the compiled folder could not be kept (the program is loaded anyway).
	keepErr error
}

// cached asks aned whether it holds the program and restores the kept folder if there is one,
// so a load finds the compiled files whichever of the two the framework relies on.
func (l *lifecycle) cached() (bool, error) {
	trace("compiledModelExists", l.id)
	aned, err := l.fw.compiledModelExists()
	if err != nil {
		return false, err
	}
	kept, err := l.src.Restore(l.id)
	if err != nil {
		return false, err
	}
	switch {
	case aned:
		l.held = FromAned
	case kept:
		l.held = FromKept
	default:
		l.held = ""
	}
	return l.held != "", nil
}

// compileNow writes the sources where the compiler reads them and compiles.
func (l *lifecycle) compileNow() error {
	if _, err := l.src.Write(l.id, l.prog); err != nil {
		return fmt.Errorf("writing the program's sources: %w", err)
	}
	trace("compile", l.id)
	if err := l.fw.compile(); err != nil {
		return err
	}
	l.compiled, l.held = true, ""
	return nil
}

// loadNow loads the program; after a compile it keeps the compiled folder. A restored kept
// folder that fails to load is removed and forgotten, so it is compiled, not restored, next
// time.
func (l *lifecycle) loadNow() error {
	trace("load", l.id)
	if err := l.fw.load(); err != nil {
		if !l.compiled && !notTheProgram(err) {
			// A held program that does not load is compiled next from a clean folder: the
			// restored files are not left for the compiler to find beside the sources.
			_ = l.src.Remove(l.id)
			if l.held == FromKept {
				_ = l.src.Forget(l.id)
			}
		}
		return err
	}
	l.origin = l.held
	if l.compiled {
		l.origin = FromCompile
		l.keepErr = l.src.Keep(l.id)
	}
	return nil
}

// notTheProgram: the load failed for the device (full, or a call that did not return), not
// for the compiled program, which stays kept.
func notTheProgram(err error) bool {
	var ce *CallError
	return errors.Is(err, ErrTimeout) || errors.As(err, &ce) && ce.ResourcesExhausted
}

// unloadNow unloads the program and removes its folder; the kept copy stays.
func (l *lifecycle) unloadNow() error {
	trace("unload", l.id)
	err := l.fw.unload()
	_ = l.src.Remove(l.id)
	return err
}

// Timeouts bound the framework's calls on one model. A call that outlives its bound has an
// unknown outcome (ErrTimeout): the process is treated as faulted.
type Timeouts struct {
	Compile, Load, Call time.Duration
}

// TimeoutsFor is the bounds for a program over seq positions. No reference publishes compile
// times by shape; maderix/ANE gives up on a call after 30 s, which a full-size layer's compile
// at a large rung can pass, so a compile gets 2 minutes per 512 positions (at least 2, at most
// 10: a whole admission is bounded by 600 s) and a load 1 minute per 1,024 (at least 1, at
// most 5); every other call 30 s. The ladder records each compile's and load's time by rung,
// the figures to set these from.
func TimeoutsFor(seq int) Timeouts {
	steps := func(per, lo, hi int) time.Duration {
		n := max(lo, min(hi, (seq+per-1)/per))
		return time.Duration(n) * time.Minute
	}
	return Timeouts{Compile: 2 * steps(512, 1, 5), Load: steps(1024, 1, 5), Call: 30 * time.Second}
}

// seqOf is the positions a program runs over (its output's).
func seqOf(p mil.Program) int { return p.Output.Seq }
