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

package artifact

import "fmt"

// IntegrityError: the artifact's files or manifest are corrupt or unreadable, or they do not
// say what the manifest claims. Check names the failed check. The artifact is quarantined.
type IntegrityError struct {
	Dir, Check, Message string
}

func (e *IntegrityError) Error() string {
	return fmt.Sprintf("ArtifactIntegrityError: %s: check %s: %s", orUnknown(e.Dir), e.Check, e.Message)
}

func integrity(check, format string, args ...any) *IntegrityError {
	return &IntegrityError{Check: check, Message: fmt.Sprintf(format, args...)}
}

// ComputeUnitMismatchError: the artifact would not run (only) on the Neural Engine: compute
// units other than CPU_AND_NE, a placement other than its backend's path, or a placement probe
// that measured it running on the CPU.
type ComputeUnitMismatchError struct {
	Dir, Check, Message string
}

func (e *ComputeUnitMismatchError) Error() string {
	return fmt.Sprintf("ComputeUnitMismatchError: %s: check %s: %s", orUnknown(e.Dir), e.Check, e.Message)
}

// PrecisionError: a precision other than fp16, which the Neural Engine path has no code for.
type PrecisionError struct {
	Dir, Precision string
}

func (e *PrecisionError) Error() string {
	return fmt.Sprintf("PrecisionError: %s: precision %q; the Neural Engine runs fp16 only", orUnknown(e.Dir), e.Precision)
}

// MismatchError: a sound artifact that is not the one asked for (another model, revision,
// checkpoint, conversion, backend or platform profile). It is not quarantined: it is simply
// not this one.
type MismatchError struct {
	Dir, Check, Message string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("ArtifactMismatchError: %s: check %s: %s", orUnknown(e.Dir), e.Check, e.Message)
}

// MissingError: there is no published artifact at the path (none, or an import that has not
// published its manifest yet).
type MissingError struct {
	Dir, Message string
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("ArtifactMissingError: %s: %s", orUnknown(e.Dir), e.Message)
}

// ParityError: the artifact's parity gate did not pass.
type ParityError struct {
	Dir, Message string
}

func (e *ParityError) Error() string {
	return fmt.Sprintf("ArtifactParityError: %s: %s", orUnknown(e.Dir), e.Message)
}

func orUnknown(dir string) string {
	if dir == "" {
		return "artifact"
	}
	return dir
}
