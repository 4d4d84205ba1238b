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
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/ebitengine/purego/objc"

	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// qos is the quality of service the framework's callers pass (user-initiated).
const qos = 21

// CallTimeout bounds one framework call; a wedged driver may never return.
var CallTimeout = 30 * time.Second

var (
	// autoreleasePoolPush and autoreleasePoolPop are libobjc's, bound by loadPoolFuncs.
	autoreleasePoolPush func() uintptr
	autoreleasePoolPop  func(uintptr)

	selMu sync.Mutex
	sels  = map[string]objc.SEL{}
)

// loadPoolFuncs binds the autorelease pool functions of libobjc (Open calls it once).
func loadPoolFuncs() error {
	lib, err := purego.Dlopen("/usr/lib/libobjc.A.dylib", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return fmt.Errorf("%w: loading libobjc: %v", ErrUnsupported, err)
	}
	purego.RegisterLibFunc(&autoreleasePoolPush, lib, "objc_autoreleasePoolPush")
	purego.RegisterLibFunc(&autoreleasePoolPop, lib, "objc_autoreleasePoolPop")
	return nil
}

// selector registers a selector once (RegisterName takes the runtime's global lock).
func selector(name string) objc.SEL {
	selMu.Lock()
	defer selMu.Unlock()
	s, ok := sels[name]
	if !ok {
		s = objc.RegisterName(name)
		sels[name] = s
	}
	return s
}

// onThread runs f on one locked OS thread inside an autorelease pool, bounded by CallTimeout.
// On a timeout f keeps its thread; the caller must treat the process as faulted.
func onThread(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		pool := autoreleasePoolPush()
		defer autoreleasePoolPop(pool)
		done <- f()
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(CallTimeout):
		return ErrTimeout
	}
}

// Model is one in-memory model: one program, at one shape.
type Model struct {
	r   *Runtime
	obj objc.ID // retained
	id  string
	src mil.Program
	tmp string
}

// NewModel builds the in-memory model of a program and reads its content identifier.
func (r *Runtime) NewModel(p mil.Program) (*Model, error) {
	m := &Model{r: r, src: p}
	err := onThread(func() error {
		text := nsData([]byte(p.Text))
		weights := nsDictionary(map[objc.ID]objc.ID{
			nsString(mil.BlobPath): nsDictionary(map[objc.ID]objc.ID{
				nsString("offset"): objc.ID(objc.GetClass("NSNumber")).Send(selector("numberWithUnsignedLongLong:"), uint64(0)),
				nsString("data"):   nsData(p.Weights),
			}),
		})
		desc := objc.ID(r.classes["_ANEInMemoryModelDescriptor"]).Send(selector("modelWithMILText:weights:optionsPlist:"), text, weights, objc.ID(0))
		if desc == 0 {
			return &CallError{Call: "descriptor", Detail: "the framework returned no descriptor for the program"}
		}
		model := objc.ID(r.classes["_ANEInMemoryModel"]).Send(selector("inMemoryModelWithDescriptor:"), desc)
		if model == 0 {
			return &CallError{Call: "model", Detail: "the framework returned no model for the descriptor"}
		}
		m.obj = model.Send(selector("retain"))
		m.id = goString(model.Send(selector("hexStringIdentifier")))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Identifier is the content identifier aned caches the compiled program by.
func (m *Model) Identifier() string { return m.id }

// Cached reports whether aned holds the program compiled: then it loads without compiling.
func (m *Model) Cached() (bool, error) {
	var cached bool
	err := onThread(func() error {
		cached = objc.Send[bool](m.obj, selector("compiledModelExists"))
		return nil
	})
	return cached, err
}

// Compile writes the program's sources where the compiler reads them (the per-user temporary
// folder, in a folder named by the identifier) and compiles it.
func (m *Model) Compile() error {
	m.tmp = filepath.Join(os.TempDir(), m.id)
	if err := os.MkdirAll(filepath.Join(m.tmp, "weights"), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(m.tmp, "model.mil"), []byte(m.src.Text), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(m.tmp, "weights", "weight.bin"), m.src.Weights, 0o600); err != nil {
		return err
	}
	return m.call("compile", "compileWithQoS:options:error:")
}

// Load makes the compiled program resident on the device.
func (m *Model) Load() error { return m.call("load", "loadWithQoS:options:error:") }

// Unload releases the program from the device and removes its sources.
func (m *Model) Unload() error {
	err := onThread(func() error {
		var nserr objc.ID
		if !objc.Send[bool](m.obj, selector("unloadWithQoS:error:"), uint32(qos), unsafe.Pointer(&nserr)) {
			return callError("unload", nserr)
		}
		return nil
	})
	if m.tmp != "" {
		os.RemoveAll(m.tmp)
	}
	return err
}

// Close releases the model object.
func (m *Model) Close() {
	_ = onThread(func() error {
		m.obj.Send(selector("release"))
		return nil
	})
}

func (m *Model) call(name, sel string) error {
	return onThread(func() error {
		var nserr objc.ID
		options := nsDictionary(nil)
		if !objc.Send[bool](m.obj, selector(sel), uint32(qos), options, unsafe.Pointer(&nserr)) {
			return callError(name, nserr)
		}
		return nil
	})
}

// callError reads an NSError.
func callError(call string, nserr objc.ID) error {
	e := &CallError{Call: call}
	if nserr != 0 {
		e.Domain = goString(nserr.Send(selector("domain")))
		e.Code = objc.Send[int](nserr, selector("code"))
		e.Detail = goString(nserr.Send(selector("localizedDescription")))
	}
	e.ResourcesExhausted = call == "load" && loadResourceCodes[e.Code]
	return e
}

func nsString(s string) objc.ID {
	return objc.ID(objc.GetClass("NSString")).Send(selector("stringWithUTF8String:"), s)
}

func nsData(b []byte) objc.ID {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	return objc.ID(objc.GetClass("NSData")).Send(selector("dataWithBytes:length:"), p, uint64(len(b)))
}

func nsDictionary(kv map[objc.ID]objc.ID) objc.ID {
	d := objc.ID(objc.GetClass("NSMutableDictionary")).Send(selector("dictionary"))
	for k, v := range kv {
		d.Send(selector("setObject:forKey:"), v, k)
	}
	return d
}

// goString copies an NSString.
func goString(s objc.ID) string {
	if s == 0 {
		return ""
	}
	p := objc.Send[*byte](s, selector("UTF8String"))
	if p == nil {
		return ""
	}
	var n int
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}
