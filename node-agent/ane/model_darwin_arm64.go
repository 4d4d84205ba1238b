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
	"math"
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

// onThread runs f on one locked OS thread inside an autorelease pool, bounded by limit (a
// wedged driver may never return). On a timeout f keeps its thread; the caller must treat the
// process as faulted.
func onThread(limit time.Duration, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		pool := autoreleasePoolPush()
		defer autoreleasePoolPop(pool)
		done <- f()
	}()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return ErrTimeout
	}
}

// Model is one in-memory model: one program, at one shape.
type Model struct {
	r   *Runtime
	obj objc.ID // retained
	id  string
	src mil.Program
	// t bounds this model's calls, by its shape.
	t  Timeouts
	lc lifecycle
}

// NewModel builds the in-memory model of a program, reads its content identifier and, where
// the framework allows, points it at the folder its sources are written to.
func (r *Runtime) NewModel(p mil.Program) (*Model, error) {
	m := &Model{r: r, src: p, t: r.timeouts(seqOf(p))}
	trace("descriptor", "")
	err := onThread(m.t.Call, func() error {
		text := nsData([]byte(p.Text))
		weights := nsDictionary(WeightsArgument(p))
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
		if r.setsURL && m.id != "" {
			url := objc.ID(objc.GetClass("NSURL")).Send(selector("fileURLWithPath:isDirectory:"), nsString(r.sources.Dir(m.id)), true)
			m.obj.Send(selector("setModelURL:"), url)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !validID(m.id) {
		m.Close()
		return nil, &CallError{Call: "model", Detail: fmt.Sprintf("the model's identifier %q is not a folder name", m.id)}
	}
	m.lc = lifecycle{src: r.sources, id: m.id, prog: p, fw: objcModel{m}}
	return m, nil
}

// Program is the program the model was built from.
func (m *Model) Program() mil.Program { return m.src }

// Identifier is the content identifier aned caches the compiled program by.
func (m *Model) Identifier() string { return m.id }

// Cached reports whether the program loads without a compile: aned holds it, or its compiled
// folder was kept (and is now restored where the framework loads it from).
func (m *Model) Cached() (bool, error) { return m.lc.cached() }

// Held is what the last Cached found: FromAned, FromKept, or "" for nothing.
func (m *Model) Held() Origin { return m.lc.held }

// Compile writes the program's sources where the compiler reads them (Sources) and compiles
// it.
func (m *Model) Compile() error { return m.lc.compileNow() }

// Load makes the program resident on the device; after a compile it keeps the compiled folder.
func (m *Model) Load() error { return m.lc.loadNow() }

// Origin is how the loaded program got onto the device; KeepErr why its compiled folder could
// not be kept, if it could not.
func (m *Model) Origin() Origin     { return m.lc.origin }
func (m *Model) KeepErr() error     { return m.lc.keepErr }
func (m *Model) Timeouts() Timeouts { return m.t }

// objcModel is the lifecycle's framework: the private API on one model, each call bounded.
type objcModel struct{ m *Model }

func (o objcModel) compiledModelExists() (bool, error) {
	var held bool
	err := onThread(o.m.t.Call, func() error {
		held = objc.Send[bool](o.m.obj, selector("compiledModelExists"))
		return nil
	})
	return held, err
}

func (o objcModel) compile() error {
	return o.m.call(o.m.t.Compile, "compile", "compileWithQoS:options:error:")
}
func (o objcModel) load() error { return o.m.call(o.m.t.Load, "load", "loadWithQoS:options:error:") }

func (o objcModel) unload() error {
	return onThread(o.m.t.Call, func() error {
		var nserr objc.ID
		if !objc.Send[bool](o.m.obj, selector("unloadWithQoS:error:"), uint32(qos), unsafe.Pointer(&nserr)) {
			return callError("unload", nserr)
		}
		return nil
	})
}

// Attributes reads the loaded program's input and output symbols.
func (m *Model) Attributes() (Attributes, error) {
	var raw any
	trace("modelAttributes", m.id)
	err := onThread(m.t.Call, func() error {
		d := m.obj.Send(selector("modelAttributes"))
		if d == 0 {
			return &CallError{Call: "attributes", Detail: "the model has no attributes (is it loaded?)"}
		}
		raw = goValue(d, 0)
		return nil
	})
	if err != nil {
		return Attributes{}, err
	}
	attrs, ok := raw.(map[string]any)
	if !ok {
		return Attributes{}, &CallError{Call: "attributes", Detail: fmt.Sprintf("modelAttributes is %T, not a dictionary", raw)}
	}
	return ParseAttributes(attrs, m.src)
}

// RawAttributes is the modelAttributes dictionary as Go values, for a diagnostic report.
func (m *Model) RawAttributes() (map[string]any, error) {
	var raw any
	trace("modelAttributes", m.id)
	err := onThread(m.t.Call, func() error {
		if d := m.obj.Send(selector("modelAttributes")); d != 0 {
			raw = goValue(d, 0)
		}
		return nil
	})
	attrs, _ := raw.(map[string]any)
	return attrs, err
}

// Unload releases the program from the device and removes its folder; the kept copy of its
// compiled folder stays for the next process.
func (m *Model) Unload() error { return m.lc.unloadNow() }

// Close releases the model object.
func (m *Model) Close() {
	_ = onThread(m.t.Call, func() error {
		m.obj.Send(selector("release"))
		return nil
	})
}

func (m *Model) call(limit time.Duration, name, sel string) error {
	return onThread(limit, func() error {
		var nserr objc.ID
		options := nsDictionary(nil)
		if !objc.Send[bool](m.obj, selector(sel), uint32(qos), options, unsafe.Pointer(&nserr)) {
			return callError(name, nserr)
		}
		return nil
	})
}

// callError reads an NSError whole: domain, code, description, userInfo and its underlying
// error (NSUnderlyingErrorKey is the string "NSUnderlyingError"), to a bounded depth.
func callError(call string, nserr objc.ID) error {
	e := readNSError(nserr, 0)
	e.Call = call
	e.ResourcesExhausted = call == "load" && loadResourceCodes[e.Code]
	return e
}

func readNSError(nserr objc.ID, depth int) *CallError {
	e := &CallError{}
	if nserr == 0 {
		return e
	}
	e.Domain = goString(nserr.Send(selector("domain")))
	e.Code = objc.Send[int](nserr, selector("code"))
	e.Detail = goString(nserr.Send(selector("localizedDescription")))
	if info := nserr.Send(selector("userInfo")); info != 0 {
		e.UserInfo, _ = goValue(info, 0).(map[string]any)
		under := info.Send(selector("objectForKey:"), nsString("NSUnderlyingError"))
		if under != 0 && depth < 4 && objc.Send[bool](under, selector("isKindOfClass:"), objc.ID(objc.GetClass("NSError"))) {
			e.Underlying = readNSError(under, depth+1)
		}
	}
	return e
}

// DeviceInfo asks +[_ANEDeviceInfo ...] about the machine, each selector only if the class
// answers it.
func (r *Runtime) DeviceInfo() DeviceInfo {
	var info DeviceInfo
	_ = onThread(30*time.Second, func() error {
		cls := objc.ID(objc.GetClass("_ANEDeviceInfo"))
		if cls == 0 {
			return nil
		}
		answers := func(sel string) bool {
			return objc.Send[bool](cls, selector("respondsToSelector:"), selector(sel))
		}
		flag := func(sel string) *bool {
			if !answers(sel) {
				return nil
			}
			v := objc.Send[bool](cls, selector(sel))
			return &v
		}
		text := func(sel string) string {
			if !answers(sel) {
				return ""
			}
			return goString(cls.Send(selector(sel)))
		}
		info.HasANE, info.VirtualMachine = flag("hasANE"), flag("isVirtualMachine")
		info.Architecture, info.Product, info.Build = text("aneArchitectureType"), text("productName"), text("buildVersion")
		if answers("numANECores") {
			info.Cores = int(objc.Send[uint32](cls, selector("numANECores")))
		}
		return nil
	})
	return info
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

func nsNumber(v uint64) objc.ID {
	return objc.ID(objc.GetClass("NSNumber")).Send(selector("numberWithUnsignedLongLong:"), v)
}

// nsDictionary builds an NSDictionary from entries in their order, with
// +dictionaryWithObjects:forKeys:count: (what an Objective-C dictionary literal compiles to).
func nsDictionary(entries []Entry) objc.ID {
	cls := objc.ID(objc.GetClass("NSDictionary"))
	if len(entries) == 0 {
		return cls.Send(selector("dictionary"))
	}
	keys, values := make([]objc.ID, len(entries)), make([]objc.ID, len(entries))
	for i, e := range entries {
		keys[i] = nsString(e.Key)
		switch v := e.Value.(type) {
		case uint64:
			values[i] = nsNumber(v)
		case []byte:
			values[i] = nsData(v)
		case []Entry:
			values[i] = nsDictionary(v)
		default:
			panic(fmt.Sprintf("ane: no NSDictionary value for %T", v))
		}
	}
	return cls.Send(selector("dictionaryWithObjects:forKeys:count:"), unsafe.Pointer(&values[0]), unsafe.Pointer(&keys[0]), uint64(len(entries)))
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

// goValue converts a property-list object (dictionaries, arrays, strings, numbers) to Go
// values; anything else becomes its description. Depth is bounded.
func goValue(obj objc.ID, depth int) any {
	if obj == 0 || depth > 16 {
		return nil
	}
	is := func(class string) bool {
		return objc.Send[bool](obj, selector("isKindOfClass:"), objc.ID(objc.GetClass(class)))
	}
	switch {
	case is("NSString"):
		return goString(obj)
	case is("NSNumber"):
		v := objc.Send[float64](obj, selector("doubleValue"))
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Sprint(v) // a report is JSON, which has no NaN
		}
		return v
	case is("NSDictionary"):
		out := map[string]any{}
		keys := obj.Send(selector("allKeys"))
		for i := range objc.Send[uint64](keys, selector("count")) {
			k := keys.Send(selector("objectAtIndex:"), i)
			name, ok := goValue(k, depth+1).(string)
			if !ok {
				name = goString(k.Send(selector("description")))
			}
			out[name] = goValue(obj.Send(selector("objectForKey:"), k), depth+1)
		}
		return out
	case is("NSArray"):
		n := objc.Send[uint64](obj, selector("count"))
		out := make([]any, 0, n)
		for i := range n {
			out = append(out, goValue(obj.Send(selector("objectAtIndex:"), i), depth+1))
		}
		return out
	case is("NSData"):
		return fmt.Sprintf("<%d bytes>", objc.Send[uint64](obj, selector("length")))
	}
	return goString(obj.Send(selector("description")))
}
