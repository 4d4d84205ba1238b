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
	"encoding/binary"
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/ebitengine/purego/objc"
	"github.com/x448/float16"
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

// surface is one IOSurface-backed fp16 tensor and the framework's object wrapping it.
type surface struct {
	ref   uintptr
	obj   objc.ID // retained
	bytes int
}

func newSurface(r *Runtime, bytes int) (*surface, error) {
	alloc := (bytes + 16383) &^ 16383 // whole 16 KiB pages
	num := func(v int) objc.ID {
		return objc.ID(objc.GetClass("NSNumber")).Send(selector("numberWithUnsignedLongLong:"), uint64(v))
	}
	props := nsDictionary(map[objc.ID]objc.ID{
		ioFuncs.keys["kIOSurfaceWidth"]:           num(bytes),
		ioFuncs.keys["kIOSurfaceHeight"]:          num(1),
		ioFuncs.keys["kIOSurfaceBytesPerElement"]: num(1),
		ioFuncs.keys["kIOSurfaceBytesPerRow"]:     num(bytes),
		ioFuncs.keys["kIOSurfaceAllocSize"]:       num(alloc),
		ioFuncs.keys["kIOSurfacePixelFormat"]:     num(0),
	})
	ref := ioFuncs.create(props)
	if ref == 0 {
		return nil, &CallError{Call: "surface", Detail: fmt.Sprintf("IOSurfaceCreate refused %d bytes", bytes)}
	}
	obj := objc.ID(r.classes["_ANEIOSurfaceObject"]).Send(selector("objectWithIOSurface:"), ref)
	if obj == 0 {
		ioFuncs.release(ref)
		return nil, &CallError{Call: "surface", Detail: "the framework did not wrap the IOSurface"}
	}
	return &surface{ref: ref, obj: obj.Send(selector("retain")), bytes: bytes}, nil
}

// write stores values as fp16.
func (s *surface) write(values []float32) error {
	if 2*len(values) != s.bytes {
		return fmt.Errorf("%d values for a surface of %d bytes", len(values), s.bytes)
	}
	if rc := ioFuncs.lock(s.ref, 0, nil); rc != 0 {
		return &CallError{Call: "surface", Detail: fmt.Sprintf("IOSurfaceLock returned %d", rc)}
	}
	defer ioFuncs.unlock(s.ref, 0, nil)
	buf := unsafe.Slice((*byte)(ioFuncs.baseAddress(s.ref)), s.bytes)
	for i, v := range values {
		binary.LittleEndian.PutUint16(buf[2*i:], float16.Fromfloat32(v).Bits())
	}
	return nil
}

// read loads fp16 values.
func (s *surface) read(values []float32) error {
	if 2*len(values) != s.bytes {
		return fmt.Errorf("%d values for a surface of %d bytes", len(values), s.bytes)
	}
	const readOnly = 1 // kIOSurfaceLockReadOnly
	if rc := ioFuncs.lock(s.ref, readOnly, nil); rc != 0 {
		return &CallError{Call: "surface", Detail: fmt.Sprintf("IOSurfaceLock returned %d", rc)}
	}
	defer ioFuncs.unlock(s.ref, readOnly, nil)
	buf := unsafe.Slice((*byte)(ioFuncs.baseAddress(s.ref)), s.bytes)
	for i := range values {
		values[i] = float16.Frombits(binary.LittleEndian.Uint16(buf[2*i:])).Float32()
	}
	return nil
}

func (s *surface) close() {
	s.obj.Send(selector("release"))
	ioFuncs.release(s.ref)
}

// Evaluator runs one loaded model on IOSurface-backed fp16 tensors. Its surfaces and request
// are made once; each Eval copies the inputs in, evaluates and copies the output out.
type Evaluator struct {
	m       *Model
	ins     []*surface
	out     *surface
	request objc.ID // retained
	sel     objc.SEL
	opts    objc.ID // retained
}

// NewEvaluator prepares evaluation of a loaded model whose inputs (in the program's order)
// hold inputs[i] fp16 values and whose output holds output values.
func (m *Model) NewEvaluator(inputs []int, output int) (*Evaluator, error) {
	if err := bindIOSurface(); err != nil {
		return nil, err
	}
	e := &Evaluator{m: m, sel: selector("evaluateWithQoS:options:request:error:")}
	err := onThread(func() error {
		for _, n := range inputs {
			s, err := newSurface(m.r, 2*n)
			if err != nil {
				return err
			}
			e.ins = append(e.ins, s)
		}
		out, err := newSurface(m.r, 2*output)
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
			inObjs, inIdx = append(inObjs, s.obj), append(inIdx, index(i))
		}
		req := objc.ID(m.r.classes["_ANERequest"]).Send(
			selector("requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:"),
			array(inObjs...), array(inIdx...), array(e.out.obj), array(index(0)), objc.ID(0), objc.ID(0), index(0))
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

// Eval evaluates the model on inputs, writing its output to out.
func (e *Evaluator) Eval(inputs [][]float32, out []float32) error {
	if len(inputs) != len(e.ins) {
		return fmt.Errorf("%d inputs for a model of %d", len(inputs), len(e.ins))
	}
	for i, in := range inputs {
		if err := e.ins[i].write(in); err != nil {
			return err
		}
	}
	err := onThread(func() error {
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
	_ = onThread(func() error {
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
