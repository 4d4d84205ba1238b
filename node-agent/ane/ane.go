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

// Package ane drives the Apple Neural Engine directly through the private AppleNeuralEngine
// framework, with purego (no cgo): in-memory models built from MIL text and weights, the aned
// cache check, compile, load, evaluate and unload. It exists on macOS on Apple silicon only;
// elsewhere Open says so. Every private class and selector is probed before use, so a macOS
// release that changed them fails with a typed error instead of aborting the process.
package ane

import (
	"errors"
	"fmt"
)

// ErrUnsupported: this system has no Neural Engine the package can drive.
var ErrUnsupported = errors.New("the Neural Engine requires macOS on Apple silicon")

// MissingError: a private class or selector the package needs is absent on this macOS build.
type MissingError struct {
	// Class is the class; Selector the selector, empty when the class itself is missing.
	Class, Selector string
	// Instance: Selector is an instance method (else a class method).
	Instance bool
}

func (e *MissingError) Error() string {
	if e.Selector == "" {
		return fmt.Sprintf("this macOS build has no class %s: the private Neural Engine API changed", e.Class)
	}
	kind := "+"
	if e.Instance {
		kind = "-"
	}
	return fmt.Sprintf("this macOS build has no %s[%s %s]: the private Neural Engine API changed", kind, e.Class, e.Selector)
}

// method is one private method the package calls.
type method struct {
	class, selector string
	instance        bool
}

// required are every private class method and instance method the package calls, checked by
// Open before any of them is used.
var required = []method{
	{"_ANEInMemoryModelDescriptor", "modelWithMILText:weights:optionsPlist:", false},
	{"_ANEInMemoryModel", "inMemoryModelWithDescriptor:", false},
	{"_ANEInMemoryModel", "hexStringIdentifier", true},
	{"_ANEInMemoryModel", "compiledModelExists", true},
	{"_ANEInMemoryModel", "compileWithQoS:options:error:", true},
	{"_ANEInMemoryModel", "loadWithQoS:options:error:", true},
	{"_ANEInMemoryModel", "evaluateWithQoS:options:request:error:", true},
	{"_ANEInMemoryModel", "unloadWithQoS:error:", true},
	// The loaded program's input and output symbols, which the binding binds by name
	// (tmc/apple private/appleneuralengine ane_in_memory_model.gen.go; jafreck/ironmill
	// crates/ironmill-ane-sys/src/model.rs model_attributes).
	{"_ANEInMemoryModel", "modelAttributes", true},
	{"_ANERequest", "requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:", false},
	{"_ANEIOSurfaceObject", "objectWithIOSurface:", false},
}

// setModelURL is used when the framework has it, and not required: without it the model
// compiles from its default folder, which is where the sources are written anyway.
var setModelURL = method{"_ANEInMemoryModel", "setModelURL:", true}

// DeviceInfo is what the framework says about the machine's Neural Engine
// (+[_ANEDeviceInfo ...], tmc/apple private/appleneuralengine ane_device_info.gen.go); a
// field the framework does not answer stays empty.
type DeviceInfo struct {
	HasANE         *bool  `json:"hasANE,omitempty"`
	VirtualMachine *bool  `json:"virtualMachine,omitempty"`
	Architecture   string `json:"architecture,omitempty"`
	Product        string `json:"product,omitempty"`
	Build          string `json:"build,omitempty"`
	Cores          int    `json:"cores,omitempty"`
}
