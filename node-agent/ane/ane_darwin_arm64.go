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
	"time"

	"github.com/ebitengine/purego"
	"github.com/ebitengine/purego/objc"
)

// frameworks are loaded in this order; the private one last.
var frameworks = []string{
	"/System/Library/Frameworks/Foundation.framework/Foundation",
	"/System/Library/Frameworks/CoreFoundation.framework/CoreFoundation",
	"/System/Library/Frameworks/IOSurface.framework/IOSurface",
	"/System/Library/PrivateFrameworks/AppleNeuralEngine.framework/AppleNeuralEngine",
}

// Runtime is the loaded private framework with every class and selector it needs probed.
type Runtime struct {
	classes map[string]objc.Class
	sources Sources
	// setsURL: the model can be pointed at its sources' folder (-setModelURL:, which
	// jundot/omlx qwen35_ane.mm calls; tmc/apple private/appleneuralengine lists it). Without
	// it the framework's default, the same folder, is relied on.
	setsURL bool
	// timeouts bounds a model's calls by its shape (TimeoutsFor unless SetTimeouts).
	timeouts func(seq int) Timeouts
}

var (
	openOnce sync.Once
	opened   *Runtime
	openErr  error

	// nsTemporaryDirectory is Foundation's NSTemporaryDirectory(), returning an NSString.
	nsTemporaryDirectory func() objc.ID
)

// Open loads the frameworks and checks, with respondsToSelector: and
// instancesRespondToSelector:, that every private class and selector the package calls
// exists. It is done once per process.
func Open() (*Runtime, error) {
	openOnce.Do(func() { opened, openErr = open() })
	return opened, openErr
}

func open() (*Runtime, error) {
	trace("open", "the frameworks, then every private class and selector")
	if err := loadPoolFuncs(); err != nil {
		return nil, err
	}
	handles := map[string]uintptr{}
	for _, path := range frameworks {
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			return nil, fmt.Errorf("%w: loading %s: %v", ErrUnsupported, path, err)
		}
		handles[path] = h
	}
	purego.RegisterLibFunc(&nsTemporaryDirectory, handles[frameworks[0]], "NSTemporaryDirectory")
	r := &Runtime{classes: map[string]objc.Class{}, timeouts: TimeoutsFor}
	responds := objc.RegisterName("respondsToSelector:")
	instancesRespond := objc.RegisterName("instancesRespondToSelector:")
	has := func(m method) (bool, error) {
		cls, ok := r.classes[m.class]
		if !ok {
			if cls = objc.GetClass(m.class); cls == 0 {
				return false, &MissingError{Class: m.class}
			}
			r.classes[m.class] = cls
		}
		probe := responds
		if m.instance {
			probe = instancesRespond
		}
		return objc.Send[bool](objc.ID(cls), probe, objc.RegisterName(m.selector)), nil
	}
	for _, m := range required {
		ok, err := has(m)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, &MissingError{Class: m.class, Selector: m.selector, Instance: m.instance}
		}
	}
	var err error
	if r.setsURL, err = has(setModelURL); err != nil {
		return nil, err
	}
	err = onThread(30*time.Second, func() error {
		r.sources.Root = goString(nsTemporaryDirectory())
		return nil
	})
	if err != nil || r.sources.Root == "" {
		return nil, fmt.Errorf("%w: Foundation gave no temporary folder (%v)", ErrUnsupported, err)
	}
	return r, nil
}

// Sources is where the compiler reads programs' sources: NSTemporaryDirectory().
func (r *Runtime) Sources() Sources { return r.sources }

// SetsModelURL reports whether models are pointed at their sources' folder explicitly.
func (r *Runtime) SetsModelURL() bool { return r.setsURL }

// SetTimeouts replaces the bounds of the models built from now on (the ladder scales them).
func (r *Runtime) SetTimeouts(f func(seq int) Timeouts) { r.timeouts = f }
