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
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/ebitengine/purego/objc"
)

// The IOSurface and CoreFoundation functions and property keys evaluation needs, bound once.
var (
	ioOnce  sync.Once
	ioErr   error
	ioFuncs struct {
		create      func(props objc.ID) uintptr
		lock        func(surface uintptr, options uint32, seed *uint32) int32
		unlock      func(surface uintptr, options uint32, seed *uint32) int32
		baseAddress func(surface uintptr) unsafe.Pointer
		release     func(ref uintptr)
		// evaluate is objc_msgSend bound to -evaluateWithQoS:options:request:error:'s
		// signature, so the hot path does not build a call through reflection each time.
		evaluate func(model objc.ID, sel objc.SEL, qos uint32, options, request objc.ID, nserr *objc.ID) bool
		keys     map[string]objc.ID
	}
)

func bindIOSurface() error {
	ioOnce.Do(func() {
		lib, err := purego.Dlopen("/System/Library/Frameworks/IOSurface.framework/IOSurface", purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			ioErr = fmt.Errorf("%w: loading IOSurface: %v", ErrUnsupported, err)
			return
		}
		cf, err := purego.Dlopen("/System/Library/Frameworks/CoreFoundation.framework/CoreFoundation", purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			ioErr = fmt.Errorf("%w: loading CoreFoundation: %v", ErrUnsupported, err)
			return
		}
		objcLib, err := purego.Dlopen("/usr/lib/libobjc.A.dylib", purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			ioErr = fmt.Errorf("%w: loading libobjc: %v", ErrUnsupported, err)
			return
		}
		purego.RegisterLibFunc(&ioFuncs.create, lib, "IOSurfaceCreate")
		purego.RegisterLibFunc(&ioFuncs.lock, lib, "IOSurfaceLock")
		purego.RegisterLibFunc(&ioFuncs.unlock, lib, "IOSurfaceUnlock")
		purego.RegisterLibFunc(&ioFuncs.baseAddress, lib, "IOSurfaceGetBaseAddress")
		purego.RegisterLibFunc(&ioFuncs.release, cf, "CFRelease")
		purego.RegisterLibFunc(&ioFuncs.evaluate, objcLib, "objc_msgSend")
		ioFuncs.keys = map[string]objc.ID{}
		for _, k := range []string{"kIOSurfaceWidth", "kIOSurfaceHeight", "kIOSurfaceBytesPerElement", "kIOSurfaceBytesPerRow",
			"kIOSurfaceAllocSize", "kIOSurfacePixelFormat"} {
			addr, err := purego.Dlsym(lib, k)
			if err != nil || addr == 0 {
				ioErr = &MissingError{Class: "IOSurface " + k}
				return
			}
			// addr is the address of the CFStringRef variable; read it without converting a
			// uintptr back to a pointer in one expression.
			ioFuncs.keys[k] = *(*objc.ID)(*(*unsafe.Pointer)(unsafe.Pointer(&addr)))
		}
	})
	return ioErr
}

// surface is one IOSurface-backed tensor and the framework's object wrapping it.
type surface struct {
	ref    uintptr
	obj    objc.ID // retained
	bytes  int
	layout Layout
}

// newSurface makes a surface of alloc bytes: width and bytes per row are the allocation,
// height and bytes per element 1, pixel format 0, as maderix/ANE training/ane_runtime.h,
// maderix/h3.c-ane h3_ane_bridge.m and jundot/omlx qwen35_ane.mm make theirs.
func newSurface(r *Runtime, alloc int, l Layout) (*surface, error) {
	if l.Bytes() > alloc {
		return nil, fmt.Errorf("a %d-byte tensor in a %d-byte surface", l.Bytes(), alloc)
	}
	num := func(v int) objc.ID { return nsNumber(uint64(v)) }
	props := objc.ID(objc.GetClass("NSMutableDictionary")).Send(selector("dictionary"))
	for _, kv := range []struct {
		key string
		val int
	}{{"kIOSurfaceWidth", alloc}, {"kIOSurfaceHeight", 1}, {"kIOSurfaceBytesPerElement", 1}, {"kIOSurfaceBytesPerRow", alloc},
		{"kIOSurfaceAllocSize", alloc}, {"kIOSurfacePixelFormat", 0}} {
		props.Send(selector("setObject:forKey:"), num(kv.val), ioFuncs.keys[kv.key])
	}
	ref := ioFuncs.create(props)
	if ref == 0 {
		return nil, &CallError{Call: "surface", Detail: fmt.Sprintf("IOSurfaceCreate refused %d bytes", alloc)}
	}
	obj := objc.ID(r.classes["_ANEIOSurfaceObject"]).Send(selector("objectWithIOSurface:"), ref)
	if obj == 0 {
		ioFuncs.release(ref)
		return nil, &CallError{Call: "surface", Detail: "the framework did not wrap the IOSurface"}
	}
	return &surface{ref: ref, obj: obj.Send(selector("retain")), bytes: alloc, layout: l}, nil
}

// write stores values as fp16 at the surface's layout.
func (s *surface) write(values []float32) error {
	if rc := ioFuncs.lock(s.ref, 0, nil); rc != 0 {
		return &CallError{Call: "surface", Detail: fmt.Sprintf("IOSurfaceLock returned %d", rc)}
	}
	defer ioFuncs.unlock(s.ref, 0, nil)
	buf := unsafe.Slice((*byte)(ioFuncs.baseAddress(s.ref)), s.bytes)
	return s.layout.Pack(buf, values)
}

// read loads fp16 values from the surface's layout.
func (s *surface) read(values []float32) error {
	const readOnly = 1 // kIOSurfaceLockReadOnly
	if rc := ioFuncs.lock(s.ref, readOnly, nil); rc != 0 {
		return &CallError{Call: "surface", Detail: fmt.Sprintf("IOSurfaceLock returned %d", rc)}
	}
	defer ioFuncs.unlock(s.ref, readOnly, nil)
	buf := unsafe.Slice((*byte)(ioFuncs.baseAddress(s.ref)), s.bytes)
	return s.layout.Unpack(buf, values)
}

func (s *surface) close() {
	s.obj.Send(selector("release"))
	ioFuncs.release(s.ref)
}

// Evaluator runs one loaded model on IOSurface-backed fp16 tensors, bound as a Binding says.
// Its surfaces and request are made once; each Eval copies the inputs in, evaluates and copies
// the output out.
type Evaluator struct {
	m       *Model
	ins     []*surface
	out     *surface
	request objc.ID // retained
	sel     objc.SEL
	opts    objc.ID // retained
}

// NewEvaluator prepares evaluation of a loaded model: one surface per input symbol of b, in
// b's order, bound to that symbol's index, and one for the output.
func (m *Model) NewEvaluator(b Binding) (*Evaluator, error) {
	if err := bindIOSurface(); err != nil {
		return nil, err
	}
	e := &Evaluator{m: m, sel: selector("evaluateWithQoS:options:request:error:")}
	var layouts []Layout
	for _, in := range b.Inputs {
		layouts = append(layouts, in.Symbol.Layout)
	}
	inAlloc, outAlloc := SurfaceBytes(layouts), SurfaceBytes([]Layout{b.Output.Symbol.Layout})
	trace("request", m.id)
	err := onThread(m.t.Call, func() error {
		for _, in := range b.Inputs {
			s, err := newSurface(m.r, inAlloc, in.Symbol.Layout)
			if err != nil {
				return err
			}
			e.ins = append(e.ins, s)
		}
		out, err := newSurface(m.r, outAlloc, b.Output.Symbol.Layout)
		if err != nil {
			return err
		}
		e.out = out
		array := func(ids ...objc.ID) objc.ID {
			a := objc.ID(objc.GetClass("NSMutableArray")).Send(selector("array"))
			for _, id := range ids {
				a.Send(selector("addObject:"), id)
			}
			return a
		}
		index := func(i int) objc.ID {
			return objc.ID(objc.GetClass("NSNumber")).Send(selector("numberWithInt:"), int32(i))
		}
		var inObjs, inIdx []objc.ID
		for i, s := range e.ins {
			inObjs, inIdx = append(inObjs, s.obj), append(inIdx, index(b.Inputs[i].Symbol.Index))
		}
		req := objc.ID(m.r.classes["_ANERequest"]).Send(
			selector("requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:"),
			array(inObjs...), array(inIdx...), array(e.out.obj), array(index(b.Output.Symbol.Index)), objc.ID(0), objc.ID(0), index(0))
		if req == 0 {
			return &CallError{Call: "request", Detail: "the framework returned no request"}
		}
		e.request = req.Send(selector("retain"))
		e.opts = nsDictionary(nil).Send(selector("retain"))
		return nil
	})
	if err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// Eval evaluates the model on inputs (in the binding's order), writing its output to out.
func (e *Evaluator) Eval(inputs [][]float32, out []float32) error {
	if len(inputs) != len(e.ins) {
		return fmt.Errorf("%d inputs for a model of %d", len(inputs), len(e.ins))
	}
	for i, in := range inputs {
		if err := e.ins[i].write(in); err != nil {
			return err
		}
	}
	trace("evaluate", e.m.id)
	err := onThread(e.m.t.Call, func() error {
		var nserr objc.ID
		if !ioFuncs.evaluate(e.m.obj, e.sel, qos, e.opts, e.request, &nserr) {
			return callError("evaluate", nserr)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return e.out.read(out)
}

// Close releases the surfaces and the request.
func (e *Evaluator) Close() {
	_ = onThread(e.m.t.Call, func() error {
		for _, s := range e.ins {
			s.close()
		}
		if e.out != nil {
			e.out.close()
		}
		if e.request != 0 {
			e.request.Send(selector("release"))
		}
		if e.opts != 0 {
			e.opts.Send(selector("release"))
		}
		return nil
	})
}
